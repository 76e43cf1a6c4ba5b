"""Per-vCPU idle entries, the x axis of the paper's Figure 1, read through gleaner itself.

The paper correlates a workload's slowdown with how often its vCPUs go idle. Why this module
asks the gleaner binary instead of reading the kernel: the sources of idle entries (cpuidle
`usage` counters, the `power:cpu_idle` tracepoint, `/proc/timer_list`, reschedule
interrupts in `/proc/interrupts`) are parsed, and the best one chosen, in exactly one place,
`gleaner_linux::idle_entries` (its module doc gives the order and what each source misses).
A Python copy of those parsers drifted from it once (it lacked the reschedule-interrupt
fallback); asking the binary leaves one parser and one choice of source.

`gleaner __idle-entries` (hidden) keeps its counters open, which the tracepoint needs: it
counts only while open. It prints one JSON line when started and one more for each line
it reads on stdin, and exits when stdin closes:
    {"source": "cpuidle", "exact": true, "per_cpu": {"0": 1234, "1": 987}}
The source is chosen once, when it starts, and recorded with the results, because the
sources do not count the same events.
"""

from __future__ import annotations

import json
import select
import subprocess
from dataclasses import dataclass
from pathlib import Path

# `source` when gleaner found nothing readable (not root, no cpuidle driver, no perf...).
SOURCE_UNAVAILABLE = "unavailable"
READ_TIMEOUT_S = 10.0


class IdleSourceError(Exception):
    """No idle-entry source could be read (or the reader failed)."""


@dataclass(frozen=True)
class IdleCounters:
    """Cumulative idle entries per CPU at one instant, and where they came from."""

    source: str
    per_cpu: dict[int, int]


def parse_reading(line: str) -> IdleCounters:
    """One JSON line of `gleaner __idle-entries` as IdleCounters."""
    try:
        reading = json.loads(line)
        source = reading["source"]
        per_cpu = {int(cpu): int(count) for cpu, count in reading["per_cpu"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise IdleSourceError(f"gleaner __idle-entries printed {line.strip()[:80]!r}: {error}") from None
    if not isinstance(source, str):
        raise IdleSourceError(f"gleaner __idle-entries printed a source that is not a name: {source!r}")
    return IdleCounters(source, per_cpu)


class IdleEntryReader:
    """A running `gleaner __idle-entries`: `read()` returns the cumulative counts now.

    Started once per suite (the first reading chooses the source); `close()` ends it. If
    the harness dies, the reader's stdin closes and it exits too.
    """

    def __init__(self, gleaner: Path) -> None:
        argv = [str(gleaner), "__idle-entries"]
        try:
            self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)
        except OSError as error:
            raise IdleSourceError(f"cannot start {gleaner} __idle-entries: {error}") from error
        try:
            first = self._next_reading()
        except IdleSourceError:
            self.close()
            raise
        if first.source == SOURCE_UNAVAILABLE:
            self.close()
            raise IdleSourceError("gleaner found no idle-entry source (no cpuidle driver, no "
                                  "power:cpu_idle tracepoint, /proc/timer_list or /proc/interrupts); run as root")
        self.source = first.source

    def _next_reading(self) -> IdleCounters:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], READ_TIMEOUT_S)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            why = self._stderr_tail() or (f"no reading within {READ_TIMEOUT_S:.0f} s" if not ready else "it exited")
            raise IdleSourceError(f"gleaner __idle-entries: {why}")
        return parse_reading(line)

    def read(self) -> IdleCounters:
        if self.process.poll() is not None or self.process.stdin is None or self.process.stdin.closed:
            raise IdleSourceError("gleaner __idle-entries is not running")
        try:
            self.process.stdin.write("\n")
            self.process.stdin.flush()
        except OSError as error:  # it exited (EPIPE)
            self.close()
            raise IdleSourceError(f"gleaner __idle-entries: {self._stderr_tail() or error}") from error
        reading = self._next_reading()
        if reading.source != self.source:
            raise IdleSourceError(f"gleaner __idle-entries changed source from {self.source} to {reading.source}")
        return reading

    def _stderr_tail(self) -> str:
        if self.process.poll() is None or self.process.stderr is None:
            return ""
        lines = [line.strip() for line in self.process.stderr.read().splitlines() if line.strip()]
        return " ".join(lines[-2:])

    def close(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:
                pass  # it exited already
        try:
            self.process.wait(READ_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


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
