"""Per-vCPU idle-transition counters, the x axis of the paper's Figure 1.

The paper correlates a workload's slowdown with how often its vCPUs go idle. Sources,
best first (the same order as `gleaner_linux::idle_entries` in the Rust crates):

1. the cpuidle per-state `usage` counters (exact; only when a cpuidle driver is loaded);
2. the `power:cpu_idle` tracepoint counted per CPU by `perf stat` (exact; root and
   `perf` installed). On guests without a cpuidle driver this is the only exact source;
3. the `.idle_calls` line per CPU in `/proc/timer_list` (root, always present with
   NO_HZ). It only counts idle entries that try to stop the tick and was measured on
   this guest to miss most of them (17 against 90 switches to idle in 2 s).

The source is chosen once per process and recorded with the results, because the
sources do not count the same events.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE_CPUIDLE = "cpuidle"
SOURCE_TRACEPOINT = "tracepoint"
SOURCE_TIMER_LIST = "timer_list"

PERF_EVENT = "power:cpu_idle"
PERF_TIMEOUT_S = 10.0

_CPU_DIR = re.compile(r"^cpu(\d+)$")
_TIMER_LIST_CPU = re.compile(r"^cpu: (\d+)\s*$")
_TIMER_LIST_IDLE_CALLS = re.compile(r"^\s*\.idle_calls\s*:\s*(\d+)\s*$")
_PERF_CPU = re.compile(r"^CPU(\d+)$")


class IdleSourceError(Exception):
    """No idle-transition source could be read (or the chosen one failed)."""


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


def parse_perf_stat(text: str) -> dict[int, int]:
    """Per-CPU `power:cpu_idle` event counts from `perf stat -A -x,` output.

    Lines look like `CPU0,528,,power:cpu_idle,1003055645,100.00,,`; `#` lines are
    comments. The counts are raw tracepoint hits: the tracepoint fires on idle entry
    and again on exit, so idle entries are half of them. A CPU reported as
    `<not counted>` or `<not supported>` makes the whole reading invalid.
    """
    counts: dict[int, int] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split(",")
        if len(fields) < 4 or PERF_EVENT not in fields[3]:
            continue
        cpu = _PERF_CPU.match(fields[0].strip())
        if not cpu:
            continue
        try:
            count = int(fields[1])
        except ValueError:
            raise IdleSourceError(f"perf stat: {fields[0]} {PERF_EVENT} is {fields[1]!r}") from None
        counts[int(cpu.group(1))] = counts.get(int(cpu.group(1)), 0) + count
    if not counts:
        raise IdleSourceError(f"perf stat printed no per-CPU {PERF_EVENT} counts")
    return counts


def tracepoint_present(sys_root: Path) -> bool:
    """Whether tracefs (or its debugfs mount) under `sys_root` has `power:cpu_idle`."""
    return any(
        (sys_root / tracefs / "events/power/cpu_idle/id").exists()
        for tracefs in ("kernel/tracing", "kernel/debug/tracing")
    )


class _PerfSession:
    """One `perf stat -a -A -e power:cpu_idle` run, counting from `start` to `stop`.

    perf starts with its events disabled (`-D -1`) and enables them on an `enable`
    command over its control pipe; its `ack` reply means the count is running, so
    nothing the caller does after `start` returns is missed. The counted command is
    `cat` on a pipe from this process: closing the pipe ends the count, and if the
    harness dies the pipe closes too, so no system-wide perf outlives it.
    """

    def __init__(self, perf: str) -> None:
        handle, name = tempfile.mkstemp(prefix="gleaner-idle-", suffix=".perf")
        os.close(handle)
        self.output = Path(name)
        ctl_read, ctl_write = os.pipe()
        ack_read, ack_write = os.pipe()
        argv = [perf, "stat", "-a", "-A", "-e", PERF_EVENT, "-x,", "-o", str(self.output), "-D", "-1",
                "--control", f"fd:{ctl_read},{ack_write}", "--", "cat"]
        try:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=(ctl_read, ack_write), start_new_session=True,
            )
        except OSError as error:
            self.output.unlink(missing_ok=True)
            raise IdleSourceError(f"cannot start {perf}: {error}") from error
        finally:
            os.close(ctl_read)
            os.close(ack_write)
        try:
            os.write(ctl_write, b"enable\n")
            reply = b""
            while b"ack" not in reply:
                ready, _, _ = select.select([ack_read], [], [], PERF_TIMEOUT_S)
                chunk = os.read(ack_read, 64) if ready else b""
                if not chunk:
                    self.stop()  # raises with perf's own message
                    raise IdleSourceError("perf stat did not acknowledge enabling its events")
                reply += chunk
        except OSError as error:  # perf exited before reading the command (EPIPE)
            self.stop()
            raise IdleSourceError(f"perf stat did not start counting: {error}") from error
        finally:
            os.close(ctl_write)
            os.close(ack_read)

    def stop(self) -> dict[int, int]:
        """Ends the count; raw tracepoint hits per CPU."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
            try:
                self.process.wait(PERF_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise IdleSourceError(f"perf stat did not stop within {PERF_TIMEOUT_S:.0f} s") from None
            errors = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
            if self.process.stderr is not None:
                self.process.stderr.close()
            if self.process.returncode != 0:
                lines = [line for line in errors.splitlines() if line.strip()]
                raise IdleSourceError(f"perf stat exited with {self.process.returncode}: "
                                      f"{' '.join(lines[-3:]) or 'no message'}")
            try:
                return parse_perf_stat(self.output.read_text())
            except OSError as error:
                raise IdleSourceError(f"cannot read perf stat output {self.output}: {error}") from error
        finally:
            self.output.unlink(missing_ok=True)


class PerfIdleCounter:
    """Cumulative idle entries per CPU from `power:cpu_idle`, counted by `perf stat`.

    `perf stat` only reports when it ends, so every `read` ends the running session,
    adds its counts and starts the next one before returning. A read before and one
    after a workload therefore bracket exactly one session. Events between sessions
    (the few milliseconds of a read) are not counted; the harness never measures there.
    """

    def __init__(self, perf: str = "perf") -> None:
        self.perf = perf
        self._events: dict[int, int] = {}
        self._session: _PerfSession | None = None

    def read(self) -> dict[int, int]:
        session, self._session = self._session, None
        if session is None:  # first read: a short session learns the CPUs and proves perf works
            session = _PerfSession(self.perf)
        try:
            counts = session.stop()
        finally:
            # Raises when perf cannot start again, so a reading that no session
            # follows is never paired with a later one as if counted.
            self._session = _PerfSession(self.perf)
        for cpu, events in counts.items():
            self._events[cpu] = self._events.get(cpu, 0) + events
        # Halving the cumulative total keeps an entry whose exit fell in the next
        # session from being lost to rounding.
        return {cpu: events // 2 for cpu, events in sorted(self._events.items())}

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                session.stop()
            except IdleSourceError:
                pass


# One perf counter per sysfs root for the whole process, so every reading shares
# one cumulative count; None once perf was tried there and failed.
_perf_counters: dict[Path, PerfIdleCounter | None] = {}


def perf_idle_counter(sys_root: Path) -> PerfIdleCounter | None:
    """The process's perf counter, started on first use; None when perf is unusable."""
    if sys_root not in _perf_counters:
        counter = None
        if os.geteuid() == 0 and shutil.which("perf") and tracepoint_present(sys_root):
            counter = PerfIdleCounter()
            try:
                counter.read()
                atexit.register(counter.close)
            except IdleSourceError:
                counter.close()
                counter = None
        _perf_counters[sys_root] = counter
    return _perf_counters[sys_root]


def read_idle_counters(sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> IdleCounters:
    """Reads the best available source; raises IdleSourceError naming the paths tried."""
    cpuidle = read_cpuidle(sys_root)
    if cpuidle is not None:
        return IdleCounters(SOURCE_CPUIDLE, cpuidle)
    perf = perf_idle_counter(sys_root)
    if perf is not None:
        return IdleCounters(SOURCE_TRACEPOINT, perf.read())
    timer_list = proc_root / "timer_list"
    try:
        counts = parse_timer_list(timer_list.read_text())
    except OSError as error:
        raise IdleSourceError(
            f"no cpuidle usage counters under {sys_root}/devices/system/cpu, no usable "
            f"{PERF_EVENT} tracepoint via perf (root, perf installed), and "
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
