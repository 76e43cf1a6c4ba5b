//! One error type for every Linux file reader and writer in this crate (procfs, sysfs,
//! cgroupfs, the journal, PM QoS polling, restore) and the affinity calls behind them.
//!
//! Exists so that each failure names the file involved and, where there is one, the fix: a
//! user who sees "permission denied" must also learn which file and what to do instead.
//! Two other error types remain, on purpose: `retention::RetentionError` (a thread that
//! cannot be pinned, made SCHED_IDLE or started names a CPU, not a file) and
//! `wakeprobe::ProbeError` (an experiment's set-up: bad gaps, too few CPUs), which wraps this
//! one for the files the probe reads.
//! Also holds the two file helpers (`read_file`, `write_file`) that turn `io::Error`s into
//! these variants, so every module maps errno values the same way.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use gleaner_policy::Cpuset;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to do when a write to a cgroup or sysfs file is refused.
pub const FIX_PERMISSION: &str = "run as root or use --backend affinity";
/// What to do when a PM QoS file may not be written.
pub const FIX_PM_QOS: &str = "run as root or use --retention-backend yield";
/// What to do when the cpuset controller is missing in a cgroup v2 tree.
pub const FIX_CPUSET_V2: &str = "enable +cpuset in the parent's cgroup.subtree_control";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },

    #[error("{path}: cannot parse {what} from {snippet:?}")]
    Parse {
        path: PathBuf,
        what: String,
        snippet: String,
    },

    #[error("{path} does not exist")]
    NotFound { path: PathBuf },

    #[error("permission denied on {path}; {fix}")]
    PermissionDenied { path: PathBuf, fix: &'static str },

    #[error("cpuset controller not available at {path}; {fix}")]
    CgroupNotEnabled { path: PathBuf, fix: String },

    #[error(
        "{path} is on a read-only file system; remount it read-write or use --backend affinity"
    )]
    ReadOnly { path: PathBuf },

    #[error(
        "{path} already exists; remove the stale cgroup (see `gleaner recover`) or pick another id"
    )]
    AlreadyExists { path: PathBuf },

    #[error("CPU set {requested:?} must be a non-empty subset of the allowed CPUs {allowed:?}")]
    InvalidCpuset { requested: Cpuset, allowed: Cpuset },

    #[error("no {what} mount found in {path}; {fix}")]
    NoMount {
        path: PathBuf,
        what: &'static str,
        fix: &'static str,
    },

    #[error("thread {tid}: {op} failed: {errno}")]
    Affinity {
        tid: u32,
        op: &'static str,
        errno: nix::errno::Errno,
    },

    #[error("{path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },

    #[error("poll-based retention is unavailable: {reason}")]
    PollUnavailable { reason: String },

    #[error("CPU {cpu} is not managed here (managed: {managed})")]
    NotManaged { cpu: usize, managed: String },

    #[error("could not record the original value of {path} before changing it: {source}")]
    Unrecorded { path: PathBuf, source: Box<Error> },

    #[error("{}", RestoreList(.errors))]
    Restore { errors: Vec<Error> },
}

impl Error {
    /// Maps an `io::Error` on `path` to the most specific variant.
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Error {
        let path = path.into();
        match source.kind() {
            io::ErrorKind::NotFound => Error::NotFound { path },
            io::ErrorKind::PermissionDenied => Error::PermissionDenied {
                path,
                fix: FIX_PERMISSION,
            },
            io::ErrorKind::AlreadyExists => Error::AlreadyExists { path },
            _ if source.raw_os_error() == Some(libc::EROFS) => Error::ReadOnly { path },
            _ => Error::Io { path, source },
        }
    }

    pub fn parse(path: impl Into<PathBuf>, what: impl Into<String>, content: &str) -> Error {
        Error::Parse {
            path: path.into(),
            what: what.into(),
            snippet: snippet(content),
        }
    }

    /// True when the thing read no longer exists (a process or thread that exited).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// The raw errno of an I/O failure, if this is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            Error::NotFound { .. } => Some(libc::ENOENT),
            Error::PermissionDenied { .. } => Some(libc::EACCES),
            Error::ReadOnly { .. } => Some(libc::EROFS),
            Error::AlreadyExists { .. } => Some(libc::EEXIST),
            _ => None,
        }
    }
}

struct RestoreList<'a>(&'a [Error]);

impl fmt::Display for RestoreList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} item(s) could not be restored (run `gleaner recover` to retry): ",
            self.0.len()
        )?;
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// At most 80 characters of the offending content, so an error stays one line.
pub(crate) fn snippet(content: &str) -> String {
    let line = content.trim();
    let cut: String = line.chars().take(80).collect();
    if cut.len() < line.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

pub(crate) fn read_file(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

/// A kernel file read every period, kept open and read again from its start.
///
/// Exists because opening is most of the cost of reading a small kernel file: on the `none`
/// guest `/proc/stat`, `cpuacct.usage_percpu` and a task's `stat` took 12–19 µs of CPU each
/// to open, read and close against 2–12 µs for a `pread` of an open one, and the three are
/// read every period (a third of the controller's own CPU during a packed ping-pong, by
/// `perf`). A seq_file (procfs, cgroupfs) prints itself anew for a read at offset 0, so the
/// content is as fresh as from a new open. The file is reopened after any failed read,
/// which is how a reused pid or a recreated cgroup is found again by its path.
#[derive(Debug)]
pub(crate) struct RereadFile {
    path: PathBuf,
    file: Option<std::fs::File>,
    bytes: Vec<u8>,
    /// How much of `bytes` the last read filled.
    text_len: usize,
}

impl RereadFile {
    pub(crate) fn new(path: PathBuf) -> Self {
        RereadFile {
            path,
            file: None,
            bytes: Vec::new(),
            text_len: 0,
        }
    }

    /// Parses the whole file as it is now. A task that exited since the file was opened
    /// reads as `NotFound` (the kernel says ESRCH), as a fresh open of its path would.
    pub(crate) fn parse<T>(&mut self, parse: impl FnOnce(&Path, &str) -> Result<T>) -> Result<T> {
        if let Err(e) = self.read_bytes() {
            self.file = None;
            return Err(match e.raw_os_error() {
                Some(libc::ESRCH) | Some(libc::ENODEV) => Error::NotFound {
                    path: self.path.clone(),
                },
                _ => Error::io(&self.path, e),
            });
        }
        match std::str::from_utf8(&self.bytes[..self.text_len]) {
            Ok(text) => parse(&self.path, text),
            Err(_) => Err(Error::parse(&self.path, "text", "(not UTF-8)")),
        }
    }

    fn read_bytes(&mut self) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let file = match &mut self.file {
            Some(file) => file,
            none => none.insert(std::fs::File::open(&self.path)?),
        };
        // The buffer keeps the size the file last needed, so one `pread` reads it all and a
        // second sees the end.
        let mut len = 0;
        loop {
            if len == self.bytes.len() {
                self.bytes.resize((2 * len).max(4096), 0);
            }
            match file.read_at(&mut self.bytes[len..], len as u64) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.text_len = len;
        Ok(())
    }
}

/// Reads a file line by line up to (not including) the first line for which `stop` holds.
/// For kernel files printed as they are read (seq_file), the rest is then never printed.
pub(crate) fn read_file_until(path: &Path, stop: impl Fn(&str) -> bool) -> Result<String> {
    use std::io::BufRead;
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut reader = std::io::BufReader::with_capacity(16 * 1024, file);
    let mut text = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        if reader
            .read_line(&mut line)
            .map_err(|e| Error::io(path, e))?
            == 0
            || stop(&line)
        {
            return Ok(text);
        }
        text.push_str(&line);
    }
}

/// Writes `content` in one `write(2)`, as kernel control files expect. The file is created
/// if missing so fake trees in tests behave like the kernel's always-present files.
pub(crate) fn write_file(path: &Path, content: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    f.write_all(content.as_bytes())
        .map_err(|e| Error::io(path, e))
}

/// Whether a file written by [`write_private_atomic`] must reach the disk before it replaces
/// the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync before the rename: the crash journal, written only when something is changed,
    /// must be whole after a power loss so that `recover` can read it.
    Fsync,
    /// No fsync: the status file is rewritten every period and means nothing after a reboot,
    /// so forcing it to disk ten times a second would only add I/O to the control loop.
    Volatile,
}

/// Replaces `path` atomically (temp file, rename) with a file only its owner can read: a
/// reader never sees half a journal or status file, and nobody else sees it at all.
pub fn write_private_atomic(path: &Path, bytes: &[u8], durability: Durability) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let io = |e| Error::io(&tmp, e);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    if durability == Durability::Fsync {
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Parses one trimmed number from a small file, naming the file on failure.
pub(crate) fn parse_num<T: std::str::FromStr>(path: &Path, what: &str, text: &str) -> Result<T> {
    text.trim()
        .parse()
        .map_err(|_| Error::parse(path, what, text))
}

pub(crate) fn read_num<T: std::str::FromStr>(path: &Path, what: &str) -> Result<T> {
    parse_num(path, what, &read_file(path)?)
}

pub(crate) fn read_cpuset(path: &Path) -> Result<Cpuset> {
    let text = read_file(path)?;
    text.parse()
        .map_err(|_| Error::parse(path, "CPU list", &text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: &mut RereadFile) -> Result<String> {
        f.parse(|_, t| Ok(t.to_string()))
    }

    #[test]
    fn a_kept_open_file_reads_what_it_holds_now_and_is_found_again_by_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stat");
        std::fs::write(&path, "cpu 1 2 3\n").unwrap();
        let mut f = RereadFile::new(path.clone());
        assert_eq!(text(&mut f).unwrap(), "cpu 1 2 3\n");
        // Rewritten in place (as the kernel reprints a seq_file), longer than the buffer.
        let long = "x".repeat(10_000);
        std::fs::write(&path, &long).unwrap();
        assert_eq!(text(&mut f).unwrap(), long);
        std::fs::write(&path, "short").unwrap();
        assert_eq!(text(&mut f).unwrap(), "short");
        // Absent: not found; created again: read from its path.
        std::fs::remove_file(&path).unwrap();
        let mut gone = RereadFile::new(path.clone());
        assert!(text(&mut gone).unwrap_err().is_not_found());
        std::fs::write(&path, "again").unwrap();
        assert_eq!(text(&mut gone).unwrap(), "again");
    }

    #[test]
    fn a_kept_open_task_file_reads_as_not_found_once_the_task_is_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let mut f = RereadFile::new(PathBuf::from(format!("/proc/{}/stat", child.id())));
        // Until it is reaped the child's stat can be read, exited or not (and before its
        // exec it bears the test's name, hence only the pid is checked).
        assert!(text(&mut f)
            .unwrap()
            .starts_with(&format!("{} (", child.id())));
        child.wait().unwrap();
        let err = text(&mut f).unwrap_err();
        assert!(err.is_not_found(), "{err}");
    }

    #[test]
    fn io_errors_map_to_specific_variants() {
        let p = Path::new("/x");
        assert!(matches!(
            Error::io(p, io::Error::from(io::ErrorKind::NotFound)),
            Error::NotFound { .. }
        ));
        let denied = Error::io(p, io::Error::from_raw_os_error(libc::EACCES));
        assert!(
            denied.to_string().contains("--backend affinity"),
            "{denied}"
        );
        assert!(matches!(
            Error::io(p, io::Error::from_raw_os_error(libc::EROFS)),
            Error::ReadOnly { .. }
        ));
        let busy = Error::io(p, io::Error::from_raw_os_error(libc::EBUSY));
        assert_eq!(busy.raw_os_error(), Some(libc::EBUSY));
    }

    #[test]
    fn parse_error_snippet_is_short_and_one_line() {
        let long = "x".repeat(500);
        let msg = Error::parse("/proc/stat", "cpu line", &long).to_string();
        assert!(msg.len() < 200, "{msg}");
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn restore_error_lists_each_failure() {
        let e = Error::Restore {
            errors: vec![
                Error::NotFound { path: "/a".into() },
                Error::ReadOnly { path: "/b".into() },
            ],
        };
        let msg = e.to_string();
        assert!(
            msg.starts_with("2 item(s)") && msg.contains("/a") && msg.contains("/b"),
            "{msg}"
        );
    }
}
