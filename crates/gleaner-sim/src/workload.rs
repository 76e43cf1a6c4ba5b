//! Workloads as thread programs: what each simulated guest thread does, op by op.
//!
//! A program is a loop over a short list of ops (compute bursts drawn from distributions,
//! mutexes, condvar-style bounded queues, barriers, guest spinlocks, sleeps). That is enough to
//! express the synchronization patterns the Gleaner paper studies, and presets build the
//! paper's workloads from it: a dedup-like pipeline, streamcluster-like barrier phases, a
//! MySQL-like server with N connections, and the matmul / freqsleep co-runners.

use std::collections::BTreeMap;
use std::fmt;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Deserializer, Serialize};

use crate::time::{parse_duration, Dur, Ns};

/// A distribution of durations.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dist {
    Const(Ns),
    /// Uniform over [lo, hi].
    Uniform(Ns, Ns),
    /// Exponential with the given mean.
    Exp(Ns),
}

impl Dist {
    /// Draw one duration; never zero, so every loop iteration of a program advances time.
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> Ns {
        let v = match *self {
            Dist::Const(v) => v,
            Dist::Uniform(lo, hi) => rng.gen_range(lo..=hi),
            Dist::Exp(mean) => {
                let u: f64 = rng.gen::<f64>();
                (-(1.0 - u).ln() * mean as f64) as Ns
            }
        };
        v.max(1)
    }

    pub fn mean(&self) -> f64 {
        match *self {
            Dist::Const(v) | Dist::Exp(v) => v as f64,
            Dist::Uniform(lo, hi) => (lo as f64 + hi as f64) / 2.0,
        }
    }
}

/// `"5us"` or `5000` is a constant; `{ exp = "5us" }` and `{ uniform = ["1us", "9us"] }` are
/// random.
impl<'de> Deserialize<'de> for Dist {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Dist;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a duration (\"5us\"), { exp = \"5us\" } or { uniform = [\"1us\", \"9us\"] }",
                )
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Dist, E> {
                Ok(Dist::Const(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Dist, E> {
                u64::try_from(v)
                    .map(Dist::Const)
                    .map_err(|_| E::custom(format!("negative duration {v}")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Dist, E> {
                parse_duration(v).map(Dist::Const).map_err(E::custom)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Dist, A::Error> {
                use serde::de::Error;
                let Some(kind) = map.next_key::<String>()? else {
                    return Err(A::Error::custom("empty distribution table"));
                };
                let dist = match kind.as_str() {
                    "const" => Dist::Const(map.next_value::<Dur>()?.0),
                    "exp" => Dist::Exp(map.next_value::<Dur>()?.0),
                    "uniform" => {
                        let [lo, hi] = map.next_value::<[Dur; 2]>()?;
                        if lo > hi {
                            return Err(A::Error::custom(format!(
                                "uniform range [{lo}, {hi}] has lo > hi"
                            )));
                        }
                        Dist::Uniform(lo.0, hi.0)
                    }
                    other => {
                        return Err(A::Error::custom(format!(
                            "unknown distribution {other:?} (use const, exp or uniform)"
                        )))
                    }
                };
                if map.next_key::<String>()?.is_some() {
                    return Err(A::Error::custom("a distribution table has exactly one key"));
                }
                Ok(dist)
            }
        }
        d.deserialize_any(V)
    }
}

/// One step of a thread program. Sync objects are named; names are per VM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// Run on the vCPU for a drawn time.
    Compute(Dist),
    /// Block for a drawn time (nanosleep): the wake comes from a timer on the thread's vCPU.
    Sleep(Dist),
    /// Blocking mutex (futex): waiters sleep; unlock wakes one, which retries.
    Lock(String),
    /// Blocking lock with direct hand-off, like the guest kernel's sleeping semaphores
    /// (mmap_sem-style rwsem, mutex hand-off): `unlock` gives the lock to the first waiter
    /// while it is still asleep, so nobody can take it until that waiter has woken. A
    /// contended hand-off lock runs at the speed of wakeups. Released with `unlock`.
    HandoffLock(String),
    Unlock(String),
    /// Guest kernel spinlock: waiters spin on their vCPU; long spins trigger pause-loop exits.
    SpinLock(String),
    SpinUnlock(String),
    /// Put one item into a bounded queue (blocks while full) / take one (blocks while empty):
    /// a mutex + two condvars, as in the pipelines of PARSEC.
    Push(String),
    Pop(String),
    /// Wait until all parties arrive.
    Barrier(String),
}

/// `count` threads running the same program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadGroup {
    #[serde(default = "one")]
    pub count: usize,
    /// Pin every thread of the group to this guest vCPU (index within the VM).
    #[serde(default)]
    pub pin: Option<usize>,
    /// Loop this many times and finish; absent means loop until the simulation ends.
    #[serde(default)]
    pub iterations: Option<u64>,
    pub program: Vec<Op>,
}

fn one() -> usize {
    1
}

/// Ready-made workloads modelled on the paper's benchmarks. Parameters left out default to
/// values that give the synchronization frequency the paper reports for the benchmark.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "preset", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Preset {
    /// PARSEC dedup: a 5-stage pipeline (fragment → refine → dedup → compress → reorder)
    /// over bounded queues, with a hash-table mutex in the dedup stage. `threads` per parallel
    /// stage (default: the VM's vCPU count, as in the paper); `items` chunks in total. Finite.
    Dedup {
        #[serde(default)]
        threads: Option<usize>,
        #[serde(default = "dedup_items")]
        items: u64,
        /// Take the allocator lock as a hand-off lock (`handoff_lock`, like a guest-kernel
        /// sleeping semaphore) instead of a barging futex mutex. Off by default: it turns the
        /// allocator into a permanent convoy that runs at wakeup speed at any vCPU count.
        #[serde(default)]
        handoff_alloc: bool,
    },
    /// PARSEC streamcluster: `phases` rounds of a short parallel compute then a barrier. Finite.
    Streamcluster {
        #[serde(default)]
        threads: Option<usize>,
        #[serde(default = "streamcluster_phases")]
        phases: u64,
        #[serde(default = "streamcluster_work")]
        work: Dist,
    },
    /// A MySQL-like OLTP server: one thread per connection running transactions
    /// (compute, a short critical section on a global lock, compute, a client round trip).
    /// Endless; throughput is transactions per second.
    Mysql {
        #[serde(default = "mysql_connections")]
        connections: usize,
    },
    /// CPU-bound co-runner: one thread per vCPU computing in `chunk` pieces. Endless.
    Matmul {
        #[serde(default)]
        threads: Option<usize>,
        #[serde(default = "matmul_chunk")]
        chunk: Dur,
    },
    /// The paper's freqsleep: one thread per vCPU repeatedly calling nanosleep(1), which sleeps
    /// for the 50 µs timer slack. Endless.
    Freqsleep {
        #[serde(default)]
        threads: Option<usize>,
    },
    /// Table 2's wakeup micro-benchmark: two threads hand a token back and forth through two
    /// one-slot queues, thread A pinned to `vcpu_a`, thread B to `vcpu_b`. Finite.
    Pingpong {
        #[serde(default)]
        vcpu_a: usize,
        #[serde(default = "one")]
        vcpu_b: usize,
        #[serde(default = "pingpong_iterations")]
        iterations: u64,
        #[serde(default = "pingpong_work")]
        work: Dist,
    },
    /// Spinlock-heavy kernel-style workload: compute, then a short critical section under a
    /// guest spinlock. Endless; sensitive to lock-holder preemption.
    Spinlock {
        #[serde(default)]
        threads: Option<usize>,
        #[serde(default = "spin_work")]
        work: Dist,
        #[serde(default = "spin_hold")]
        hold: Dist,
    },
}

fn dedup_items() -> u64 {
    200_000
}
fn streamcluster_phases() -> u64 {
    2_000
}
fn streamcluster_work() -> Dist {
    Dist::Uniform(60_000, 140_000)
}
fn mysql_connections() -> usize {
    16
}
fn matmul_chunk() -> Dur {
    Dur(10_000_000)
}
fn pingpong_iterations() -> u64 {
    2_000
}
fn pingpong_work() -> Dist {
    Dist::Const(50_000)
}
fn spin_work() -> Dist {
    Dist::Exp(20_000)
}
fn spin_hold() -> Dist {
    Dist::Const(3_000)
}

/// A preset expanded into the same pieces a hand-written workload has.
#[derive(Debug, Default)]
pub struct Expanded {
    pub threads: Vec<ThreadGroup>,
    pub queues: BTreeMap<String, usize>,
}

fn c(d: Dist) -> Op {
    Op::Compute(d)
}
fn s(name: &str) -> String {
    name.to_string()
}

impl Preset {
    pub fn expand(&self, vcpus: usize) -> Expanded {
        let mut out = Expanded::default();
        match self {
            Preset::Dedup {
                threads,
                items,
                handoff_alloc,
            } => {
                // PARSEC dedup barely scales past 4 cores natively (7.1 s on 4, 7.6 s on 16):
                // the serial fragment stage bounds it, and chunk allocation and the hash
                // table are hot mutexes (in the guest kernel and libc). Per-chunk costs are
                // chosen so: a serial 8 us fragment stage, ~35 us of parallel work, and three
                // 3 us critical sections on a shared allocator lock per chunk (the fragment
                // stage allocates too, so the serial stage itself blocks on it). Every stage
                // boundary is a condvar queue, so threads block and wake once per chunk per
                // stage. Threads per parallel stage default to the vCPU count (the paper runs
                // as many threads as vCPUs, §3).
                let n = threads.unwrap_or(vcpus).max(1);
                let per = (*items / n as u64).max(1);
                let items = per * n as u64;
                for q in ["chunks", "refined", "unique", "packed"] {
                    out.queues.insert(s(q), 64);
                }
                let group = |count, iterations, program| ThreadGroup {
                    count,
                    pin: None,
                    iterations: Some(iterations),
                    program,
                };
                let locked = |lock: &str, hold: u64| {
                    let take = if lock == "alloc" && *handoff_alloc {
                        Op::HandoffLock(s(lock))
                    } else {
                        Op::Lock(s(lock))
                    };
                    [take, c(Dist::Exp(hold)), Op::Unlock(s(lock))]
                };
                let mut fragment = vec![c(Dist::Exp(8_000))];
                fragment.extend(locked("alloc", 3_000));
                fragment.push(Op::Push(s("chunks")));
                out.threads.push(group(1, items, fragment));
                let mut refine = vec![Op::Pop(s("chunks")), c(Dist::Exp(8_000))];
                refine.extend(locked("alloc", 3_000));
                refine.push(Op::Push(s("refined")));
                out.threads.push(group(n, per, refine));
                let mut dedup = vec![Op::Pop(s("refined")), c(Dist::Exp(2_000))];
                dedup.extend(locked("hashtable", 3_000));
                dedup.push(Op::Push(s("unique")));
                out.threads.push(group(n, per, dedup));
                let mut compress = vec![Op::Pop(s("unique")), c(Dist::Exp(18_000))];
                compress.extend(locked("alloc", 3_000));
                compress.push(Op::Push(s("packed")));
                out.threads.push(group(n, per, compress));
                out.threads.push(group(
                    1,
                    items,
                    vec![Op::Pop(s("packed")), c(Dist::Exp(2_000))],
                ));
            }
            Preset::Streamcluster {
                threads,
                phases,
                work,
            } => {
                let n = threads.unwrap_or(vcpus).max(1);
                out.threads.push(ThreadGroup {
                    count: n,
                    pin: None,
                    iterations: Some(*phases),
                    program: vec![c(work.clone()), Op::Barrier(s("phase"))],
                });
            }
            Preset::Mysql { connections } => {
                out.threads.push(ThreadGroup {
                    count: (*connections).max(1),
                    pin: None,
                    iterations: None,
                    program: vec![
                        c(Dist::Exp(40_000)),
                        Op::Lock(s("lock_sys")),
                        c(Dist::Exp(4_000)),
                        Op::Unlock(s("lock_sys")),
                        c(Dist::Exp(30_000)),
                        Op::Sleep(Dist::Exp(60_000)),
                    ],
                });
            }
            Preset::Matmul { threads, chunk } => {
                out.threads.push(ThreadGroup {
                    count: threads.unwrap_or(vcpus).max(1),
                    pin: None,
                    iterations: None,
                    program: vec![c(Dist::Const(chunk.0.max(1)))],
                });
            }
            Preset::Freqsleep { threads } => {
                out.threads.push(ThreadGroup {
                    count: threads.unwrap_or(vcpus).max(1),
                    pin: None,
                    iterations: None,
                    program: vec![Op::Sleep(Dist::Const(50_000)), c(Dist::Const(2_000))],
                });
            }
            Preset::Pingpong {
                vcpu_a,
                vcpu_b,
                iterations,
                work,
            } => {
                out.queues.insert(s("ping"), 1);
                out.queues.insert(s("pong"), 1);
                out.threads.push(ThreadGroup {
                    count: 1,
                    pin: Some(*vcpu_a),
                    iterations: Some(*iterations),
                    program: vec![c(work.clone()), Op::Push(s("ping")), Op::Pop(s("pong"))],
                });
                out.threads.push(ThreadGroup {
                    count: 1,
                    pin: Some(*vcpu_b),
                    iterations: Some(*iterations),
                    program: vec![Op::Pop(s("ping")), c(work.clone()), Op::Push(s("pong"))],
                });
            }
            Preset::Spinlock {
                threads,
                work,
                hold,
            } => {
                out.threads.push(ThreadGroup {
                    count: threads.unwrap_or(vcpus).max(1),
                    pin: None,
                    iterations: None,
                    program: vec![
                        c(work.clone()),
                        Op::SpinLock(s("kernel")),
                        c(hold.clone()),
                        Op::SpinUnlock(s("kernel")),
                    ],
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn dedup_runs_a_thread_per_vcpu_per_stage_and_can_hand_off_the_allocator() {
        let e = Preset::Dedup {
            threads: None,
            items: 100,
            handoff_alloc: false,
        }
        .expand(4);
        let counts: Vec<usize> = e.threads.iter().map(|g| g.count).collect();
        assert_eq!(counts, vec![1, 4, 4, 4, 1]);
        // The serial fragment stage allocates too.
        assert!(e.threads[0].program.contains(&Op::Lock(s("alloc"))));
        assert!(!e
            .threads
            .iter()
            .any(|g| g.program.iter().any(|o| matches!(o, Op::HandoffLock(_)))));
        let h = Preset::Dedup {
            threads: None,
            items: 100,
            handoff_alloc: true,
        }
        .expand(16);
        assert_eq!(h.threads[1].count, 16);
        assert!(h.threads[0].program.contains(&Op::HandoffLock(s("alloc"))));
        assert!(h.threads[2].program.contains(&Op::Lock(s("hashtable"))));
    }

    #[test]
    fn samples_stay_in_range_and_positive() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..1000 {
            let u = Dist::Uniform(10, 20).sample(&mut rng);
            assert!((10..=20).contains(&u));
            assert!(Dist::Exp(100).sample(&mut rng) >= 1);
        }
        assert_eq!(Dist::Const(0).sample(&mut rng), 1);
    }

    #[test]
    fn exp_mean_is_close() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let n = 20_000;
        let sum: u64 = (0..n).map(|_| Dist::Exp(10_000).sample(&mut rng)).sum();
        let mean = sum as f64 / n as f64;
        assert!((mean - 10_000.0).abs() < 300.0, "mean {mean}");
    }

    #[test]
    fn dedup_stages_balance_items() {
        let e = Preset::Dedup {
            threads: Some(3),
            items: 100,
            handoff_alloc: false,
        }
        .expand(4);
        let total = |g: &ThreadGroup| g.count as u64 * g.iterations.unwrap();
        // 100 rounds down to 99 so that 3 threads per stage split the chunks evenly.
        assert!(e.threads.iter().all(|g| total(g) == 99));
    }
}
