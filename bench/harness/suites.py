"""The named suites: which workloads, how long each runs, and how many repetitions.

`quick` must finish in under ten minutes on the 2-vCPU development guest including
MariaDB, so it keeps one representative of each kind of blocking (sysbench threads,
futex storms, a fine-grained pipeline, OLTP) at short durations. `full` adds the
remaining workloads, longer runs and the paper's connection sweep for OLTP.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import parse
from .workloads import CommandWorkload, OltpWorkload, PigzWorkload, Workload

# Seconds added to every run by the harness and wrappers (process start, idle-counter
# reads, gleaner's own start/stop); measured on the dev guest, used only for estimates.
RUN_OVERHEAD_S = 0.6
QUICK_BUDGET_S = 600.0


def sysbench_threads(seconds: int) -> Workload:
    return CommandWorkload(
        "sysbench-threads",
        f"sysbench threads, 8 threads, 2 locks, {seconds} s",
        "events",
        "events/s",
        True,
        seconds,
        ("sysbench",),
        argv=["sysbench", "threads", "--threads=8", "--thread-locks=2", f"--time={seconds}", "--rand-seed=1", "run"],
        metric_of=lambda output, _wall: parse.sysbench_events_per_s(output),
    )


def sysbench_mutex(locks: int, est_s: float) -> Workload:
    return CommandWorkload(
        "sysbench-mutex",
        f"sysbench mutex, 8 threads, {locks} lock acquisitions each (fixed work)",
        "total time",
        "s",
        False,
        est_s,
        ("sysbench",),
        argv=["sysbench", "mutex", "--threads=8", f"--mutex-locks={locks}", "--rand-seed=1", "run"],
        metric_of=lambda output, _wall: parse.sysbench_total_time(output),
    )


def stress_ng(stressor: str, seconds: int) -> Workload:
    return CommandWorkload(
        f"stress-ng-{stressor}",
        f"stress-ng --{stressor} 4 for {seconds} s",
        "bogo ops",
        "bogo ops/s",
        True,
        seconds,
        ("stress-ng",),
        argv=["stress-ng", f"--{stressor}", "4", "--timeout", f"{seconds}s", "--metrics-brief"],
        metric_of=lambda output, _wall: parse.stress_ng_bogo_ops_per_s(output, stressor),
    )


def bundled(name: str, workload: str, unit: str, est_s: float, args: list[str], description: str) -> Workload:
    """A `gleaner workload` run; its `--json` report's throughput_per_s is the metric."""
    return CommandWorkload(
        name,
        f"gleaner workload {workload} {' '.join(args)} ({description})",
        "throughput",
        unit,
        True,
        est_s,
        (),
        argv=["{gleaner}", "workload", workload, *args, "--json"],
        metric_of=lambda output, _wall: parse.json_number(
            parse.last_json_object(output, "throughput_per_s"), "throughput_per_s"
        ),
        needs_gleaner=True,
    )


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    workloads: tuple[Workload, ...]
    reps: int
    # phases of the pipeline run whose active-vCPU timeline is plotted
    phase_run: tuple[tuple[str, float], ...]
    # extra `gleaner probe --json` arguments, and how long the probe takes with them
    probe_args: tuple[str, ...] = ()
    probe_est_s: float = 12.0

    def estimate_s(self, n_configs: int, reps: int | None = None) -> float:
        """Expected wall time: every run plus the phase run and per-workload setup."""
        reps = self.reps if reps is None else reps
        runs = sum((workload.est_s + RUN_OVERHEAD_S) * n_configs * reps for workload in self.workloads)
        setup = sum(8.0 if isinstance(workload, OltpWorkload) else 1.0 for workload in self.workloads)
        return runs + setup + sum(seconds for _, seconds in self.phase_run) + self.probe_est_s


def _pipeline(label: str, work: int, seconds: float) -> Workload:
    return bundled(
        f"pipeline-{label}", "pipeline", "items/s", seconds, ["--work", str(work), "--duration", f"{seconds:g}s"],
        f"{label}-grained: {work} hash iterations per item per stage",
    )


def quick() -> Suite:
    return Suite(
        "quick",
        "one workload per blocking pattern, short runs (< 10 min on 2 vCPUs)",
        (
            sysbench_threads(2),
            stress_ng("futex", 2),
            _pipeline("fine", 500, 2),
            OltpWorkload("oltp-c4", connections=4, seconds=3),
        ),
        reps=5,
        phase_run=(("fine", 5.0), ("coarse", 5.0)),
        # 4 settings x 8 gaps (8.9 ms summed) x 100 wakes: about 4 s instead of 11 s
        probe_args=("--samples", "100"),
        probe_est_s=5.0,
    )


def full() -> Suite:
    return Suite(
        "full",
        "all workloads, longer runs, OLTP connection sweep",
        (
            sysbench_threads(5),
            sysbench_mutex(200_000, 3.0),
            stress_ng("futex", 5),
            stress_ng("mutex", 5),
            PigzWorkload("pigz", size_mib=64, est_s=3.0),
            _pipeline("fine", 500, 5),
            _pipeline("coarse", 5000, 5),
            bundled("pingpong", "pingpong", "round_trips/s", 5, ["--duration", "5s"], "two threads bouncing a token"),
            bundled("mutex", "mutex", "ops/s", 5, ["--duration", "5s"], "contended mutex"),
            bundled("barrier", "barrier", "episodes/s", 5, ["--duration", "5s"], "barrier episodes"),
            bundled("matmul", "matmul", "reps/s", 5, ["--duration", "5s"], "CPU-bound, no blocking"),
            OltpWorkload("oltp-c2", connections=2, seconds=10),
            OltpWorkload("oltp-c4", connections=4, seconds=10),
            OltpWorkload("oltp-c8", connections=8, seconds=10),
        ),
        reps=5,
        phase_run=(("fine", 5.0), ("coarse", 5.0)),
    )


def daemon() -> Suite:
    """The workloads of the daemon's acceptance target (issue 2): each must run no more than
    3 % slower under `gleaner run` than without, and within 5 % of the best fixed policy."""
    return Suite(
        "daemon",
        "the daemon's acceptance workloads: fine/coarse pipeline, ping-pong, sysbench threads, stress-ng futex, pigz, CPU-bound",
        (
            _pipeline("fine", 500, 3),
            _pipeline("coarse", 5000, 3),
            bundled("pingpong", "pingpong", "round_trips/s", 3, ["--duration", "3s"], "two threads bouncing a token (futex)"),
            sysbench_threads(3),
            stress_ng("futex", 3),
            PigzWorkload("pigz", size_mib=64, est_s=3.0),
            bundled("matmul", "matmul", "reps/s", 3, ["--duration", "3s"], "CPU-bound, no blocking"),
        ),
        reps=5,
        phase_run=(("fine", 5.0), ("coarse", 5.0)),
        probe_args=("--samples", "100"),
        probe_est_s=5.0,
    )


SUITES = {"quick": quick, "full": full, "daemon": daemon}
