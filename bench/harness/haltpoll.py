"""The `haltpoll` configuration: guest halt-polling as the competing mitigation.

Guest halt polling makes an idle vCPU spin for `guest_halt_poll_ns` before executing
HLT, which avoids the exit/wakeup cost the paper attributes to blocked-waiter wakeups.
The parameter belongs to the haltpoll cpuidle governor and only acts when the cpuidle
driver is `haltpoll`; on a guest whose driver is `none` writing it changes nothing, and
a result labelled "haltpoll" would be a second baseline in disguise. This module
therefore reports whether the setting can take effect, and writes the parameter only
for the duration of a run, restoring the previous value on every exit path.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .cleanup import CleanupStack

PARAM_PATH = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
CPUIDLE_DRIVER_PATH = Path("/sys/devices/system/cpu/cpuidle/current_driver")
HALT_POLL_NS = 200_000
# Where an override records the value to restore before it writes: SIGKILL (a tool's
# timeout, the OOM killer) runs no handler, so the next harness start restores from here.
JOURNAL_DIR = Path("/run/gleaner-bench")


class HaltpollError(Exception):
    """Reading or writing the haltpoll parameter failed."""


@dataclass(frozen=True)
class HaltpollStatus:
    """Whether the haltpoll configuration can run here and whether it would matter."""

    runnable: bool  # the parameter exists and we may write it
    effective: bool  # the cpuidle driver is haltpoll, so the value changes behaviour
    driver: str  # the cpuidle driver name, or "missing"
    reason: str  # one line for the results table

    def label(self) -> str:
        if not self.runnable:
            return f"skipped: {self.reason}"
        if not self.effective:
            return f"ineffective: {self.reason}"
        return "effective"


def haltpoll_status(
    param_path: Path = PARAM_PATH,
    driver_path: Path = CPUIDLE_DRIVER_PATH,
    is_root: bool | None = None,
) -> HaltpollStatus:
    """Inspects the parameter file and the cpuidle driver without changing anything."""
    if is_root is None:
        is_root = os.geteuid() == 0
    try:
        driver = driver_path.read_text().strip()
    except OSError:
        driver = "missing"
    effective = driver == "haltpoll"
    driver_note = (
        "cpuidle driver is haltpoll"
        if effective
        else f"cpuidle driver is '{driver}' ({driver_path}), not 'haltpoll', "
        "so guest_halt_poll_ns has no effect"
    )
    if not param_path.exists():
        return HaltpollStatus(False, effective, driver, f"{param_path} does not exist (no haltpoll module)")
    if not is_root:
        return HaltpollStatus(False, effective, driver, f"writing {param_path} needs root")
    return HaltpollStatus(True, effective, driver, driver_note)


class ParamOverride:
    """Context manager: writes `value` to a sysfs-style file, restores the old value on exit.

    The restore is registered on a `CleanupStack`, so it also runs from the stack's
    signal handlers and atexit hook if the process is interrupted mid-run.
    """

    def __init__(self, path: Path, value: str, stack: CleanupStack, journal_dir: Path | None = None) -> None:
        self.path = path
        self.journal = (journal_dir or JOURNAL_DIR) / f"{str(path).strip('/').replace('/', '_')}.json"
        self.value = value
        self.stack = stack
        self.old_value: str | None = None
        self._token: int | None = None

    def __enter__(self) -> ParamOverride:
        try:
            self.old_value = self.path.read_text().strip()
        except OSError as error:
            raise HaltpollError(f"cannot read {self.path}: {error}") from error
        old_value = self.old_value
        try:
            self.journal.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.journal.write_text(json.dumps({"path": str(self.path), "old_value": old_value, "pid": os.getpid()}))
        except OSError as error:
            raise HaltpollError(f"cannot record the restore in {self.journal}: {error}") from error
        # Register the restore before writing: a signal between the write and the
        # registration would otherwise leave the new value behind.
        self._token = self.stack.push(f"restore {self.path}={old_value}", lambda: self._restore(old_value))
        try:
            self._write(self.value)
        except HaltpollError:
            self.stack.run_one(self._token)
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._token is not None:
            self.stack.run_one(self._token)
            self._token = None

    def _restore(self, value: str) -> None:
        self._write(value)
        self.journal.unlink(missing_ok=True)

    def _write(self, value: str) -> None:
        try:
            self.path.write_text(f"{value}\n")
        except OSError as error:
            raise HaltpollError(f"cannot write {value} to {self.path}: {error}") from error


def restore_stale(journal_dir: Path = JOURNAL_DIR) -> list[str]:
    """Restores values left by overrides whose process died without restoring (SIGKILL).

    Returns one line per restored file. Records of a live process are left alone.
    """
    restored = []
    for record in sorted(journal_dir.glob("*.json")) if journal_dir.is_dir() else []:
        try:
            entry = json.loads(record.read_text())
            path, value, pid = Path(entry["path"]), str(entry["old_value"]), int(entry["pid"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise HaltpollError(f"unreadable restore record {record}: {error}; fix or delete it") from error
        if pid != os.getpid() and Path(f"/proc/{pid}").exists():
            continue
        try:
            path.write_text(f"{value}\n")
        except OSError as error:
            raise HaltpollError(f"cannot restore {value} to {path}: {error}") from error
        record.unlink(missing_ok=True)
        restored.append(f"{path}={value}")
    return restored
