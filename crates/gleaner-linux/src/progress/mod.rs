//! The application's own progress counter (transactions, items, requests done), read once a
//! period, so that the policy judges a change by what the program got done instead of by its
//! utilization.
//!
//! Exists because utilization is a proxy that can mislead: a consolidation removes wake-up
//! overhead that counted as run time, so utilization can fall while throughput rises, and a
//! workload whose utilization swings ±20 % a period on its own hides a 10 % loss. Where the
//! application counts its work, that count is the signal (issue 16). Two sources: a file that
//! holds the counter (a metrics file, a `/proc`-style stats file, one the application
//! rewrites), a command that prints it, or a series of a Prometheus page on loopback
//! ([`prometheus`]). The first number in a file or a command's output is the counter; it only
//! grows, and a fall (the application restarted) starts it afresh.

pub mod prometheus;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the counter is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgressSource {
    /// A file whose first number is the counter.
    File(PathBuf),
    /// A shell command (`sh -c`) whose output's first number is the counter.
    Command(String),
    /// A series of a Prometheus text page served on loopback (the sum of the series of that
    /// name where no labels are given).
    Metric {
        url: prometheus::MetricsUrl,
        series: String,
    },
}

impl std::fmt::Display for ProgressSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProgressSource::File(p) => write!(f, "file {}", p.display()),
            ProgressSource::Command(c) => write!(f, "command `{c}`"),
            ProgressSource::Metric { url, series } => write!(f, "metric {series} at {url}"),
        }
    }
}

/// Why a period's counter could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProgressError {
    #[error("progress {source_desc}: {why}")]
    Read { source_desc: String, why: String },
    #[error("progress {source_desc}: no number in {snippet:?}; it must print or hold the counter (e.g. `12345`)")]
    NoNumber {
        source_desc: String,
        snippet: String,
    },
    #[error(
        "progress {source_desc}: the page has no such series; check its name with `curl -s {url}`"
    )]
    NoSeries { source_desc: String, url: String },
}

/// The longest a progress command may run, or a metrics page take to answer: it is read on
/// the controller's thread, once a period, and a hung source must not stall the policy.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

/// Reads the counter each period and hands the policy what it grew by.
#[derive(Debug)]
pub struct ProgressReader {
    source: ProgressSource,
    last: Option<u64>,
}

impl ProgressReader {
    pub fn new(source: ProgressSource) -> Self {
        Self { source, last: None }
    }

    pub fn source(&self) -> &ProgressSource {
        &self.source
    }

    /// Takes the counter's base as Gleaner's first window opens, so that the first period
    /// is judged too. A counter file not there yet is one the application creates as it
    /// starts counting (with `gleaner run`, Gleaner starts before the program it runs): its
    /// base is zero. A file that cannot be read otherwise, or a failing command, sets no
    /// base: the first period that reads it does.
    pub fn start(&mut self) {
        match self.read_counter() {
            Ok(now) => self.last = Some(now),
            Err(_) if matches!(&self.source, ProgressSource::File(p) if !p.exists()) => {
                self.last = Some(0)
            }
            Err(_) => {}
        }
    }

    /// What the counter grew by since the last read: `None` on the first read and after a
    /// fall (both only set the base), an error where it could not be read (the base stays).
    pub fn delta(&mut self) -> Result<Option<u64>, ProgressError> {
        let now = self.read_counter()?;
        let delta = match self.last {
            Some(before) if now >= before => Some(now - before),
            _ => None,
        };
        self.last = Some(now);
        Ok(delta)
    }

    /// The counter's current value.
    pub fn read_counter(&self) -> Result<u64, ProgressError> {
        let text = match &self.source {
            ProgressSource::File(path) => read_file(path),
            ProgressSource::Command(cmd) => run_command(cmd),
            ProgressSource::Metric { url, series } => {
                let page = url
                    .fetch(COMMAND_TIMEOUT)
                    .map_err(|why| ProgressError::Read {
                        source_desc: self.source.to_string(),
                        why,
                    })?;
                return prometheus::series_value(&page, series)
                    .map(|v| v.max(0.0).round() as u64)
                    .ok_or_else(|| ProgressError::NoSeries {
                        source_desc: self.source.to_string(),
                        url: url.to_string(),
                    });
            }
        }
        .map_err(|why| ProgressError::Read {
            source_desc: self.source.to_string(),
            why,
        })?;
        first_number(&text).ok_or_else(|| ProgressError::NoNumber {
            source_desc: self.source.to_string(),
            snippet: text.chars().take(60).collect(),
        })
    }
}

/// Reads of a counter file found empty before one is taken as its content.
const EMPTY_FILE_READS: u32 = 4;

/// The file's text. An empty file is read again, 1 ms apart, a few times: one that an
/// application rewrites in place (`echo $n > file`: truncated, then written) is empty for a
/// moment now and then, and a period read in that moment was not judged (seen in CI: the
/// first period of a shell-written counter lost so).
fn read_file(path: &Path) -> Result<String, String> {
    let mut reads = 0;
    loop {
        let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                "no such file (yet); the application must create it".to_string()
            }
            _ => e.to_string(),
        })?;
        reads += 1;
        if !text.trim().is_empty() || reads >= EMPTY_FILE_READS {
            return Ok(text);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `sh -c cmd` and returns its standard output, killing it after [`COMMAND_TIMEOUT`].
/// The output is drained by a thread while the command runs: one that prints more than a pipe
/// holds (a whole metrics page) would otherwise block until the timeout.
fn run_command(cmd: &str) -> Result<String, String> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start sh: {e}"))?;
    let mut stdout = child.stdout.take().ok_or("no pipe to its output")?;
    let drain = std::thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).map(|_| out)
    });
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                // The drain ends when the last writer (a grandchild may hold the pipe) exits;
                // it is not waited for.
                return Err(format!(
                    "still running after {} s: the command must print the counter and exit",
                    COMMAND_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    if !status.success() {
        return Err(format!("exited with {status}"));
    }
    match drain.join() {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(format!("reading its output: {e}")),
        Err(_) => Err("reading its output failed".into()),
    }
}

/// The first non-negative number in `text` (digits, optionally a fraction or exponent, as a
/// Prometheus sample value is written), truncated to an integer. Digits inside a word
/// (`tx2_total`) are part of a name, not the counter.
pub fn first_number(text: &str) -> Option<u64> {
    text.split(|c: char| c.is_whitespace() || c == ',' || c == ';' || c == '=' || c == ':')
        .filter(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        .find_map(|w| w.parse::<f64>().ok())
        .filter(|x| x.is_finite() && *x >= 0.0)
        .map(|x| x as u64)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

    use super::*;

    #[test]
    fn the_first_number_is_the_counter() {
        assert_eq!(first_number("12345\n"), Some(12345));
        assert_eq!(first_number("transactions: 991"), Some(991));
        // A Prometheus sample line: the name's digits are not the value.
        assert_eq!(first_number("tx2_total{db=\"a\"} 1.5e3"), Some(1500));
        assert_eq!(first_number("done=42 ms=7"), Some(42));
        assert_eq!(first_number("none here"), None);
        assert_eq!(first_number(""), None);
    }

    #[test]
    fn a_file_counter_gives_what_it_grew_by_and_a_fall_starts_it_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("count");
        let mut r = ProgressReader::new(ProgressSource::File(path.clone()));
        // Not there yet: an error naming the file, and no base taken.
        let e = r.delta().unwrap_err().to_string();
        assert!(e.contains("count") && e.contains("no such file"), "{e}");
        std::fs::write(&path, "100\n").unwrap();
        assert_eq!(r.delta().unwrap(), None);
        std::fs::write(&path, "250\n").unwrap();
        assert_eq!(r.delta().unwrap(), Some(150));
        // The application restarted: the counter fell; the base moves, nothing is reported.
        std::fs::write(&path, "7\n").unwrap();
        assert_eq!(r.delta().unwrap(), None);
        std::fs::write(&path, "17\n").unwrap();
        assert_eq!(r.delta().unwrap(), Some(10));
        // Empty (an application rewriting it in place, caught between truncating and
        // writing), and still empty after a few more reads: an error; the base stays.
        std::fs::write(&path, "").unwrap();
        let e = r.delta().unwrap_err().to_string();
        assert!(e.contains("no number"), "{e}");
        std::fs::write(&path, "17\n").unwrap();
        assert_eq!(r.delta().unwrap(), Some(0));
        // Garbage: an error that says what is expected; the base stays.
        std::fs::write(&path, "n/a\n").unwrap();
        let e = r.delta().unwrap_err().to_string();
        assert!(e.contains("no number") && e.contains("n/a"), "{e}");
        std::fs::write(&path, "20\n").unwrap();
        assert_eq!(r.delta().unwrap(), Some(3));
    }

    #[test]
    fn a_counter_taken_at_the_start_judges_the_first_period() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("count");
        // There at the start: its value is the base.
        std::fs::write(&path, "40\n").unwrap();
        let mut r = ProgressReader::new(ProgressSource::File(path.clone()));
        r.start();
        std::fs::write(&path, "90\n").unwrap();
        assert_eq!(r.delta().unwrap(), Some(50));
        // Created by the application after the start: counted from zero.
        let late = dir.path().join("late");
        let mut r = ProgressReader::new(ProgressSource::File(late.clone()));
        r.start();
        std::fs::write(&late, "30\n").unwrap();
        assert_eq!(r.delta().unwrap(), Some(30));
        // Unreadable for another reason (garbage): no base; the first read sets it.
        std::fs::write(&path, "n/a\n").unwrap();
        let mut r = ProgressReader::new(ProgressSource::File(path.clone()));
        r.start();
        std::fs::write(&path, "30\n").unwrap();
        assert_eq!(r.delta().unwrap(), None);
    }

    #[test]
    fn a_command_counter_is_its_output_and_a_failing_or_hung_command_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "5").unwrap();
        let mut r = ProgressReader::new(ProgressSource::Command(format!(
            "echo \"ops_total $(cat {})\"",
            path.display()
        )));
        assert_eq!(r.delta().unwrap(), None);
        std::fs::write(&path, "12").unwrap();
        assert_eq!(r.delta().unwrap(), Some(7));
        let failing = ProgressReader::new(ProgressSource::Command("exit 3".into()));
        let e = failing.read_counter().unwrap_err().to_string();
        assert!(e.contains("exit"), "{e}");
        let hung = ProgressReader::new(ProgressSource::Command("sleep 5".into()));
        let t = Instant::now();
        let e = hung.read_counter().unwrap_err().to_string();
        assert!(e.contains("still running"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }

    /// Serves each of `answers` to one connection, in order, on a loopback port.
    fn serve(answers: Vec<&'static str>) -> (String, std::thread::JoinHandle<()>) {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            for answer in answers {
                let (mut conn, _) = listener.accept().unwrap();
                let mut request = [0u8; 1024];
                let n = conn.read(&mut request).unwrap();
                assert!(request[..n].starts_with(b"GET /metrics HTTP/1.0\r\n"));
                if answer == "hang" {
                    std::thread::sleep(Duration::from_secs(2));
                    continue;
                }
                conn.write_all(answer.as_bytes()).unwrap();
            }
        });
        (url, server)
    }

    #[test]
    fn a_metric_counter_is_read_from_the_page_each_period() {
        let ok = |n: u32| -> &'static str {
            Box::leak(
                format!("HTTP/1.0 200 OK\r\n\r\n# TYPE tx_total counter\ntx_total{{db=\"a\"}} {n}\ntx_total{{db=\"b\"}} 5\n")
                    .into_boxed_str(),
            )
        };
        let (url, server) = serve(vec![
            ok(100),
            ok(160),
            "HTTP/1.0 200 OK\r\n\r\nother_total 1\n",
            "HTTP/1.0 500 Internal Server Error\r\n\r\n",
            "hang",
        ]);
        let source = ProgressSource::Metric {
            url: prometheus::MetricsUrl::parse(&url).unwrap(),
            series: "tx_total".into(),
        };
        let mut r = ProgressReader::new(source);
        r.start();
        assert_eq!(r.delta().unwrap(), Some(60));
        let e = r.delta().unwrap_err().to_string();
        assert!(
            e.contains("no such series") && e.contains("curl -s http://127.0.0.1"),
            "{e}"
        );
        let e = r.delta().unwrap_err().to_string();
        assert!(e.contains("500"), "{e}");
        let t = Instant::now();
        let e = r.delta().unwrap_err().to_string();
        assert!(e.contains("within 1000 ms"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        server.join().unwrap();
        // Nobody listening: said so.
        let e = r.delta().unwrap_err().to_string();
        assert!(
            e.contains("cannot connect") && e.contains("listening"),
            "{e}"
        );
    }
}
