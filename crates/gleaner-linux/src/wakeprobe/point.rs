//! One probe point: a waker and a wakee thread, pinned, handing a futex back and forth at a
//! chosen gap while the wakee's vCPU is kept in the setting's state.
//!
//! Apart from the probe's plan and report ([`super::measure`], [`super::quick_calibration`])
//! because this is the part whose timing matters: the threads, their handshake and what
//! keeps the wakee's vCPU busy, halted or polling while they run.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use gleaner_policy::Cpuset;
use gleaner_sys::affinity::{pin_current_thread, set_current_thread_affinity, thread_affinity};
use gleaner_sys::clock::{monotonic_ns as now_ns, sleep_ns, spin_ns};
use gleaner_sys::futex;

use super::{open_poll, LatencyStats, ProbeConfig, ProbeError, ProbePoint, Setting};
use crate::pmqos::PollRetention;
use crate::retention::{RetentionMode, RetentionPool, YielderParams};

/// What keeps the wakee's vCPU busy during a setting; dropping it restores the vCPU.
pub(super) enum SettingEnv {
    Nothing,
    Yield(RetentionPool),
    Poll(PollRetention),
}

impl SettingEnv {
    pub(super) fn enter(
        setting: Setting,
        wakee_cpu: usize,
        cfg: &ProbeConfig,
    ) -> Result<Self, ProbeError> {
        Ok(match setting {
            Setting::SameVcpu | Setting::Halted => SettingEnv::Nothing,
            Setting::BusyYield => {
                let pool = RetentionPool::start(
                    &[wakee_cpu].into_iter().collect(),
                    YielderParams::default(),
                )?;
                pool.set_mode(wakee_cpu, RetentionMode::HOLD_FOREVER)?;
                SettingEnv::Yield(pool)
            }
            Setting::BusyPoll => {
                let mut poll = open_poll(cfg, wakee_cpu)?;
                poll.set(wakee_cpu, true)?;
                SettingEnv::Poll(poll)
            }
        })
    }

    pub(super) fn leave(self) -> Result<(), ProbeError> {
        match self {
            SettingEnv::Nothing => Ok(()),
            SettingEnv::Yield(pool) => {
                pool.stop();
                Ok(())
            }
            SettingEnv::Poll(mut poll) => Ok(poll.restore()?),
        }
    }
}

/// Keeps the calling thread on the waker's CPU while a point runs, so that its own wake-ups
/// (progress polling) never land on the wakee's vCPU and pull it out of halt. Restores the
/// thread's previous CPU mask on drop.
struct CallerPinned {
    previous: Cpuset,
}

impl CallerPinned {
    fn pin(cpu: usize) -> Result<Self, ProbeError> {
        let previous = thread_affinity(0).map_err(|source| ProbeError::Affinity { source })?;
        pin_current_thread(cpu).map_err(|source| ProbeError::Pin {
            role: "calling",
            cpu,
            source,
        })?;
        Ok(Self { previous })
    }
}

impl Drop for CallerPinned {
    fn drop(&mut self) {
        // The previous mask was valid a moment ago; if a CPU went offline since, the kernel
        // keeps the thread runnable anyway and there is nothing better to do here.
        let _ = set_current_thread_affinity(&self.previous);
    }
}

/// The two futex words and the wake timestamp shared by waker and wakee.
///
/// Round `i`: the wakee sets `armed = i + 1` and blocks on `seq == i`; the waker waits for
/// `armed`, lets the gap pass, stamps `wake_ts` and bumps `seq` with a `FUTEX_WAKE`. Waiting for
/// `armed` first makes the gap the time the wakee stays blocked, however slow its last wake was.
struct Handshake {
    seq: AtomicU32,
    armed: AtomicU32,
    wake_ts: AtomicU64,
    stop: AtomicBool,
    done: AtomicU64,
}

struct WakeeResult {
    latencies: Vec<u64>,
    blocked: Vec<u64>,
    not_blocked: usize,
}

pub(super) fn run_point(
    setting: Setting,
    waker_cpu: usize,
    wakee_cpu: usize,
    gap_ns: u64,
    cfg: &ProbeConfig,
    mut progress: impl FnMut(u64),
) -> Result<ProbePoint, ProbeError> {
    let rounds = (cfg.warmup + cfg.samples) as u32;
    let hs = Handshake {
        seq: AtomicU32::new(0),
        armed: AtomicU32::new(0),
        wake_ts: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        done: AtomicU64::new(0),
    };
    let _pinned = CallerPinned::pin(waker_cpu)?;
    // Safety net for the futex waits: never reached in a healthy run, it only bounds a hang.
    let wait_limit_ns = 1_000_000_000 + 2 * gap_ns;
    let gap = Gap::for_setting(setting, gap_ns);
    let (wakee, waker) = std::thread::scope(|s| {
        let hs = &hs;
        let wakee = std::thread::Builder::new()
            .name("gleaner-wakee".into())
            .spawn_scoped(s, move || {
                wakee_side(hs, wakee_cpu, rounds, cfg.warmup as u32, wait_limit_ns)
            })
            .map_err(|source| ProbeError::Spawn {
                role: "wakee",
                source,
            })?;
        let (finished_tx, finished_rx) = mpsc::channel::<()>();
        let waker = match std::thread::Builder::new()
            .name("gleaner-waker".into())
            .spawn_scoped(s, move || {
                let _finished = finished_tx; // dropped on return: wakes the loop below
                waker_side(hs, waker_cpu, rounds, gap, wait_limit_ns)
            }) {
            Ok(handle) => handle,
            Err(source) => {
                hs.stop.store(true, Ordering::Release);
                futex_wake(&hs.seq);
                return Err(ProbeError::Spawn {
                    role: "waker",
                    source,
                });
            }
        };
        while let Err(RecvTimeoutError::Timeout) =
            finished_rx.recv_timeout(Duration::from_millis(100))
        {
            progress(hs.done.load(Ordering::Relaxed));
        }
        // Neither side panics; a join error could only come from a bug, reported as a hang would be.
        let waker = waker.join().unwrap_or(Err(ProbeError::Spawn {
            role: "waker",
            source: io::Error::other("thread panicked"),
        }));
        let wakee = wakee.join().unwrap_or(Err(ProbeError::Spawn {
            role: "wakee",
            source: io::Error::other("thread panicked"),
        }));
        Ok((wakee, waker))
    })?;
    waker?;
    let wakee = wakee?;
    let latency =
        LatencyStats::from_samples(&wakee.latencies).ok_or_else(|| ProbeError::Config {
            reason: format!("no wake at gap {gap_ns} ns found the wakee blocked; use a longer gap"),
        })?;
    let blocked = &wakee.blocked;
    let blocked_mean_ns = (blocked.iter().map(|&b| u128::from(b)).sum::<u128>()
        / blocked.len().max(1) as u128) as u64;
    Ok(ProbePoint {
        setting,
        gap_ns,
        latency,
        samples_ns: wakee.latencies,
        blocked_mean_ns,
        not_blocked: wakee.not_blocked,
        in_kernel: None,
    })
}

/// Runs `rounds` wakes and keeps those after the first `warmup`. The warm-up is counted in
/// rounds, not in blocked samples: skipping the first `warmup` *samples* dropped measured
/// wakes whenever a warm-up round had not blocked, and with few samples left none (CI on the
/// haltpoll guest under steal: 3 samples at 20 µs, "no wake found the wakee blocked").
fn wakee_side(
    hs: &Handshake,
    cpu: usize,
    rounds: u32,
    warmup: u32,
    wait_limit_ns: u64,
) -> Result<WakeeResult, ProbeError> {
    if let Err(source) = pin_current_thread(cpu) {
        hs.stop.store(true, Ordering::Release);
        futex_wake(&hs.armed);
        return Err(ProbeError::Pin {
            role: "wakee",
            cpu,
            source,
        });
    }
    let mut result = WakeeResult {
        latencies: Vec::with_capacity(rounds as usize),
        blocked: Vec::with_capacity(rounds as usize),
        not_blocked: 0,
    };
    for i in 0..rounds {
        let blocked_at = now_ns();
        hs.armed.store(i + 1, Ordering::Release);
        futex_wake(&hs.armed);
        let mut slept = false;
        while hs.seq.load(Ordering::Acquire) == i {
            if hs.stop.load(Ordering::Acquire) {
                return Ok(result);
            }
            futex_wait(&hs.seq, i, wait_limit_ns);
            slept = true;
        }
        let running = now_ns();
        let wake_ts = hs.wake_ts.load(Ordering::Relaxed);
        if i < warmup {
            continue;
        }
        if slept {
            result.latencies.push(running.saturating_sub(wake_ts));
            result.blocked.push(wake_ts.saturating_sub(blocked_at));
        } else {
            result.not_blocked += 1;
        }
    }
    Ok(result)
}

/// How the waker lets the gap pass before it wakes the wakee.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gap {
    /// Sleeping: the waker's vCPU may idle through the gap, which is nothing to the wakee
    /// when it waits on another vCPU.
    Sleep(u64),
    /// Spinning on the clock, for setting A (waker and wakee on one vCPU): Table 2's A is a
    /// wake that costs "only a context switch between the threads inside the guest OS". A
    /// sleeping waker would leave that vCPU with nothing to run, so it would halt through every
    /// gap and each wake would come right after the vCPU's return from the hypervisor; on the
    /// `none` guest that made A's in-kernel p50 3.1 µs against 2.1 µs for a ping-pong confined
    /// to one vCPU, whose vCPU never idles (`bench/wake_latency_check.py`, 2026-11-26).
    Spin(u64),
}

impl Gap {
    pub(super) fn for_setting(setting: Setting, gap_ns: u64) -> Self {
        if setting == Setting::SameVcpu {
            Gap::Spin(gap_ns)
        } else {
            Gap::Sleep(gap_ns)
        }
    }

    pub(super) fn pass(self) {
        match self {
            Gap::Sleep(ns) => sleep_ns(ns),
            Gap::Spin(ns) => spin_ns(ns),
        }
    }
}

fn waker_side(
    hs: &Handshake,
    cpu: usize,
    rounds: u32,
    gap: Gap,
    wait_limit_ns: u64,
) -> Result<(), ProbeError> {
    let fail = |e| {
        hs.stop.store(true, Ordering::Release);
        futex_wake(&hs.seq);
        Err(e)
    };
    if let Err(source) = pin_current_thread(cpu) {
        return fail(ProbeError::Pin {
            role: "waker",
            cpu,
            source,
        });
    }
    // The default 50 µs timer slack would blur the shorter gaps; best effort, a failure only
    // blurs them.
    let _ = gleaner_sys::sched::set_current_thread_timer_slack_ns(1);
    for i in 0..rounds {
        loop {
            let armed = hs.armed.load(Ordering::Acquire);
            if armed > i {
                break;
            }
            if hs.stop.load(Ordering::Acquire) {
                return Ok(()); // the wakee failed and reports why
            }
            futex_wait(&hs.armed, armed, wait_limit_ns);
        }
        gap.pass();
        hs.wake_ts.store(now_ns(), Ordering::Relaxed);
        hs.seq.store(i + 1, Ordering::Release);
        futex_wake(&hs.seq);
        hs.done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// FUTEX_WAIT while `*word == expected`, at most `timeout_ns`. Early returns are fine
/// (callers re-check the word), and so is a failure: the wait is then a short spin, and the
/// wait limit still bounds a hang.
fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let _ = futex::wait(word, expected, Some(Duration::from_nanos(timeout_ns)));
}

/// Wakes every waiter; FUTEX_WAKE on a live word cannot fail.
fn futex_wake(word: &AtomicU32) {
    let _ = futex::wake(word, u32::MAX);
}

/// Wakes of an unwaited futex timed to find the user↔kernel crossing cost.
const CROSSING_SAMPLES: usize = 2_000;

/// Median time, on `cpu`, of a `FUTEX_WAKE` that wakes nobody: a system call's entry and
/// return plus the futex lookup. The probe's clock runs from before the waker's `FUTEX_WAKE`
/// to the wakee's return to user space, so it includes about one such crossing that an
/// in-kernel clock (the BPF sampler's, `sched_waking` to switch-in) does not; comparing the
/// two needs this number.
pub(super) fn crossing_ns(cpu: usize) -> Result<u64, ProbeError> {
    let _pinned = CallerPinned::pin(cpu)?;
    let word = AtomicU32::new(0);
    let mut samples: Vec<u64> = (0..CROSSING_SAMPLES)
        .map(|_| {
            let t0 = now_ns();
            futex_wake(&word);
            now_ns().saturating_sub(t0)
        })
        .collect();
    samples.sort_unstable();
    Ok(samples[samples.len() / 2])
}
