//! Where the metrics go: the loopback HTTP endpoint and the node_exporter textfile.
//!
//! Apart from rendering because this is the only part that does I/O: a deliberately tiny
//! HTTP/1.1 responder that answers `GET /metrics` and nothing else (so it accepts no input
//! that could change Gleaner's state), and an atomic file writer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

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
pub(super) const MAX_REQUEST: usize = 8192;

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
