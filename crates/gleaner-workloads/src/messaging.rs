//! `messaging`: groups of sender and receiver threads exchanging small messages over Unix
//! sockets, in the manner of hackbench (`perf bench sched messaging`).
//!
//! Exists because a program of many threads that each block on a socket read after every few
//! microseconds of work is the heaviest wake-up load a scheduler sees: with the default 160
//! threads, every message is a wake-up of a receiver that was blocked, usually on another
//! vCPU. It is what Gleaner's own measurement must not slow down (issue 14's overhead target)
//! and what its consolidation may speed up. In each group every sender writes `loops` messages
//! of [`MESSAGE_BYTES`] to every receiver of the group; a receiver reads until all its senders
//! are done. Message contents depend only on (group, sender, receiver, loop), so a counted
//! run's checksum does not depend on the interleaving.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use crate::harness::{join, spawn_gated, StartGate};
use crate::hash::mix;
use crate::phase::Length;
use crate::report::{rate, Report};
use crate::{require_positive, WorkloadError};

/// hackbench's message size.
pub const MESSAGE_BYTES: usize = 100;

/// Parameters of a messaging run.
#[derive(Debug, Clone)]
pub struct MessagingConfig {
    pub groups: usize,
    /// Senders per group, and receivers per group (hackbench's "fds").
    pub pairs: usize,
    /// Messages each sender sends to each receiver, or how long the senders send.
    pub length: Length,
}

/// The message sender `s` of group `g` sends receiver `r` in loop `l`: its first 8 bytes
/// identify it, the rest is filler.
fn message(g: usize, s: usize, r: usize, l: u64) -> [u8; MESSAGE_BYTES] {
    let mut m = [0x5a; MESSAGE_BYTES];
    let id = mix(((g as u64) << 48) ^ ((s as u64) << 32) ^ ((r as u64) << 20) ^ l);
    m[..8].copy_from_slice(&id.to_le_bytes());
    m
}

/// Runs the messaging workload and returns its report.
pub fn messaging(cfg: &MessagingConfig) -> Result<Report, WorkloadError> {
    require_positive("groups", cfg.groups)?;
    require_positive("pairs", cfg.pairs)?;
    if let Length::Count(0) = cfg.length {
        return Err(WorkloadError::ZeroParameter { name: "loops" });
    }
    // Per group and receiver: the end the senders write to, and the end the receiver reads.
    let mut groups = Vec::with_capacity(cfg.groups);
    for _ in 0..cfg.groups {
        let mut ends = Vec::with_capacity(cfg.pairs);
        for _ in 0..cfg.pairs {
            ends.push(UnixStream::pair().map_err(|e| WorkloadError::Io {
                what: "create a socket pair".into(),
                source: e,
            })?);
        }
        groups.push(ends);
    }
    let gate = StartGate::new();
    let deadline_after = match cfg.length {
        Length::Duration(d) => Some(d),
        Length::Count(_) => None,
    };
    let loops = match cfg.length {
        Length::Count(n) => n,
        Length::Duration(_) => u64::MAX,
    };

    thread::scope(|scope| {
        let mut receivers = Vec::new();
        let mut senders = Vec::new();
        for (g, ends) in groups.into_iter().enumerate() {
            let mut writers: Vec<Vec<UnixStream>> = (0..cfg.pairs).map(|_| Vec::new()).collect();
            for (r, (to_receiver, mut from_senders)) in ends.into_iter().enumerate() {
                for w in writers.iter_mut() {
                    w.push(to_receiver.try_clone().map_err(|e| WorkloadError::Io {
                        what: "clone a socket".into(),
                        source: e,
                    })?);
                }
                // The original write end closes here: EOF reaches the receiver once every
                // sender has dropped its clone.
                drop(to_receiver);
                receivers.push(spawn_gated(
                    scope,
                    &gate,
                    format!("gw-msg-r{g}-{r}"),
                    move || {
                        let mut buf = [0u8; MESSAGE_BYTES];
                        let (mut count, mut checksum) = (0u64, 0u64);
                        while from_senders.read_exact(&mut buf).is_ok() {
                            count += 1;
                            let id = u64::from_le_bytes([
                                buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7],
                            ]);
                            checksum = checksum.wrapping_add(id);
                        }
                        (count, checksum)
                    },
                )?);
            }
            for (s, mut to_receivers) in writers.into_iter().enumerate() {
                senders.push(spawn_gated(
                    scope,
                    &gate,
                    format!("gw-msg-s{g}-{s}"),
                    move || {
                        let deadline = deadline_after.map(|d| Instant::now() + d);
                        let mut l = 0u64;
                        while l < loops && deadline.is_none_or(|t| Instant::now() < t) {
                            for (r, to) in to_receivers.iter_mut().enumerate() {
                                if to.write_all(&message(g, s, r, l)).is_err() {
                                    return;
                                }
                            }
                            l += 1;
                        }
                    },
                )?);
            }
        }

        let start = gate.open();
        for handle in senders {
            join(handle)?;
        }
        let (mut messages, mut checksum) = (0u64, 0u64);
        for handle in receivers {
            let (n, sum) = join(handle)?;
            messages += n;
            checksum = checksum.wrapping_add(sum);
        }
        let elapsed = start.elapsed().max(Duration::from_nanos(1));
        Ok(Report {
            workload: "messaging".into(),
            threads: 2 * cfg.groups * cfg.pairs,
            unit: "messages".into(),
            ops: messages,
            elapsed_s: elapsed.as_secs_f64(),
            throughput_per_s: rate(messages, elapsed),
            checksum: matches!(cfg.length, Length::Count(_)).then_some(checksum),
            phases: Vec::new(),
            stage_items: None,
            latency_ns: None,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(groups: usize, pairs: usize, loops: u64) -> MessagingConfig {
        MessagingConfig {
            groups,
            pairs,
            length: Length::Count(loops),
        }
    }

    #[test]
    fn every_message_arrives_once_and_the_checksum_does_not_depend_on_the_interleaving() {
        let a = messaging(&counted(2, 3, 50)).unwrap();
        assert_eq!(a.ops, 2 * 3 * 3 * 50);
        assert_eq!(a.threads, 12);
        let expected = (0..2)
            .flat_map(|g| {
                (0..3)
                    .flat_map(move |s| (0..3).flat_map(move |r| (0..50).map(move |l| (g, s, r, l))))
            })
            .map(|(g, s, r, l)| u64::from_le_bytes(message(g, s, r, l)[..8].try_into().unwrap()))
            .fold(0u64, u64::wrapping_add);
        assert_eq!(a.checksum, Some(expected));
        let b = messaging(&counted(2, 3, 50)).unwrap();
        assert_eq!(a.checksum, b.checksum);
    }

    #[test]
    fn a_timed_run_stops_and_reports_what_was_delivered() {
        let r = messaging(&MessagingConfig {
            groups: 1,
            pairs: 2,
            length: Length::Duration(Duration::from_millis(50)),
        })
        .unwrap();
        assert!(r.ops > 0);
        assert_eq!(r.checksum, None);
    }

    #[test]
    fn zero_groups_or_loops_are_refused() {
        assert!(messaging(&counted(0, 2, 1)).is_err());
        assert!(messaging(&counted(1, 0, 1)).is_err());
        assert!(messaging(&counted(1, 1, 0)).is_err());
    }
}
