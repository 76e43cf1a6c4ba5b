"""Per-vCPU idle-transition counters, the x axis of the paper's Figure 1.

The paper correlates a workload's slowdown with how often its vCPUs go idle. Linux
exposes that count in two places: the cpuidle per-state `usage` counters (only when a
cpuidle driver is loaded) and the `.idle_calls` line per CPU in `/proc/timer_list`
(root only, always present with NO_HZ). We prefer cpuidle and fall back to timer_list,
and record which one was used because the two count slightly different events
(entered idle states vs. calls into the idle loop's tick-stop path).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SOURCE_CPUIDLE = "cpuidle"
SOURCE_TIMER_LIST = "timer_list"

_CPU_DIR = re.compile(r"^cpu(\d+)$")
_TIMER_LIST_CPU = re.compile(r"^cpu: (\d+)\s*$")
_TIMER_LIST_IDLE_CALLS = re.compile(r"^\s*\.idle_calls\s*:\s*(\d+)\s*$")


class IdleSourceError(Exception):
    """Neither idle-transition source could be read."""


@dataclass(frozen=True)
class IdleCounters:
    """Cumulative idle entries per CPU at one instant, and where they came from."""

    source: str
    per_cpu: dict[int, int]


def read_cpuidle(sys_root: Path) -> dict[int, int] | None:
    """Sums `cpuidle/state*/usage` per CPU; None when no CPU has cpuidle states."""
    cpu_root = sys_root / "devices" / "system" / "cpu"
    counts: dict[int, int] = {}
    if not cpu_root.is_dir():
        return None
    for cpu_dir in cpu_root.iterdir():
        match = _CPU_DIR.match(cpu_dir.name)
        if not match:
            continue
        usages = sorted((cpu_dir / "cpuidle").glob("state*/usage"))
        if not usages:
            continue
        total = 0
        for usage in usages:
            try:
                total += int(usage.read_text().strip())
            except (OSError, ValueError):
                return None  # a half-readable tree would mix sources; use the fallback
        counts[int(match.group(1))] = total
    return counts or None


def parse_timer_list(text: str) -> dict[int, int]:
    """Extracts `.idle_calls` per CPU from `/proc/timer_list` text."""
    counts: dict[int, int] = {}
    cpu: int | None = None
    for line in text.splitlines():
        cpu_match = _TIMER_LIST_CPU.match(line)
        if cpu_match:
            cpu = int(cpu_match.group(1))
            continue
        calls_match = _TIMER_LIST_IDLE_CALLS.match(line)
        if calls_match and cpu is not None:
            counts[cpu] = int(calls_match.group(1))
    return counts


def read_idle_counters(sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> IdleCounters:
    """Reads the preferred available source; raises IdleSourceError naming both tried paths."""
    cpuidle = read_cpuidle(sys_root)
    if cpuidle is not None:
        return IdleCounters(SOURCE_CPUIDLE, cpuidle)
    timer_list = proc_root / "timer_list"
    try:
        counts = parse_timer_list(timer_list.read_text())
    except OSError as error:
        raise IdleSourceError(
            f"no cpuidle usage counters under {sys_root}/devices/system/cpu and "
            f"cannot read {timer_list} ({error}); run the harness as root"
        ) from error
    if not counts:
        raise IdleSourceError(f"{timer_list} has no per-CPU .idle_calls lines")
    return IdleCounters(SOURCE_TIMER_LIST, counts)


def idle_rates(before: IdleCounters, after: IdleCounters, seconds: float) -> dict[int, float]:
    """Idle transitions per second for each CPU present in both readings."""
    if seconds <= 0:
        raise ValueError(f"interval must be positive, got {seconds}")
    if before.source != after.source:
        raise ValueError(f"idle sources differ: {before.source} then {after.source}")
    return {
        cpu: (after.per_cpu[cpu] - before.per_cpu[cpu]) / seconds
        for cpu in sorted(before.per_cpu)
        if cpu in after.per_cpu
    }
