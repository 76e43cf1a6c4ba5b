//! systemd's readiness and watchdog protocol (`sd_notify`), without libsystemd.
//!
//! Exists so the unit can be `Type=notify` with `WatchdogSec=`: `systemctl start` returns
//! once the configuration is loaded and the metrics endpoint is bound, and a supervisor
//! loop that hangs is restarted by systemd. Outside systemd (no `NOTIFY_SOCKET`) every call
//! does nothing.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

/// Sends `state` (e.g. `READY=1`, `STATUS=...`) to the service manager; false when there is
/// none or the datagram could not be sent (the protocol has no reply to wait for).
pub fn notify(state: &str) -> bool {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return false;
    };
    let Ok(sock) = UnixDatagram::unbound() else {
        return false;
    };
    let bytes = path.as_encoded_bytes();
    let sent = match bytes.strip_prefix(b"@") {
        // An abstract socket (systemd's own is a path, but the protocol allows both).
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
        }
        None => sock.send_to(state.as_bytes(), &path),
    };
    sent.is_ok()
}

/// Keeps systemd's watchdog fed from the supervisor loop: pings at half the interval that
/// `WatchdogSec=` sets (`WATCHDOG_USEC`), as sd_watchdog_enabled(3) recommends.
pub struct Watchdog {
    interval: Option<Duration>,
    last: Instant,
}

impl Watchdog {
    /// Reads `WATCHDOG_USEC` (and `WATCHDOG_PID`, which must be us if set).
    pub fn from_env() -> Self {
        let for_us = std::env::var("WATCHDOG_PID")
            .ok()
            .is_none_or(|p| p.trim() == std::process::id().to_string());
        let usec = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|u| *u > 0 && for_us);
        Watchdog {
            interval: usec.map(|u| Duration::from_micros(u) / 2),
            last: Instant::now(),
        }
    }

    /// Pings if half the watchdog interval has passed since the last ping.
    pub fn tick(&mut self) {
        if let Some(every) = self.interval {
            if self.last.elapsed() >= every {
                notify("WATCHDOG=1");
                self.last = Instant::now();
            }
        }
    }
}

/// Children must not talk to the service manager in the daemon's name.
pub const ENV_VARS: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_reach_the_socket_named_by_notify_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        // The variable is process-wide: this is the only test in the crate that sets it.
        std::env::set_var("NOTIFY_SOCKET", &path);
        assert!(notify("READY=1"));
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        std::env::set_var("NOTIFY_SOCKET", dir.path().join("absent"));
        assert!(!notify("READY=1"));
        std::env::remove_var("NOTIFY_SOCKET");
        assert!(!notify("READY=1"));
    }
}
