"""Running child commands so that none outlives the harness.

Children start in their own session, so a terminal Ctrl-C reaches only the harness,
which then stops them deliberately: SIGTERM to the whole process group first (so
`gleaner run` can restore the cgroups and affinities it changed), SIGKILL only if
that grace period passes. The stop is registered on the cleanup stack for the whole
lifetime of the child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

from .cleanup import CleanupStack

TERM_GRACE_S = 10.0


class CommandError(Exception):
    """A child command could not be started, failed or timed out."""


@dataclass(frozen=True)
class Completed:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    @property
    def output(self) -> str:
        """stdout then stderr: tools differ in where they print their report."""
        return self.stdout + self.stderr


def stop_process_group(process: subprocess.Popen, grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM the child's process group, SIGKILL it after `grace_s`; waits for the child."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def start(argv: list[str], stack: CleanupStack, label: str, **popen_args) -> tuple[subprocess.Popen, int]:
    """Starts `argv` in a new session; returns the process and its cleanup token."""
    try:
        process = subprocess.Popen(argv, start_new_session=True, **popen_args)
    except OSError as error:
        raise CommandError(f"cannot start {argv[0]}: {error}") from error
    token = stack.push(f"stop {label} (pid {process.pid})", lambda: stop_process_group(process))
    return process, token


def run(argv: list[str], stack: CleanupStack, timeout_s: float, capture: bool = True) -> Completed:
    """Runs `argv` to completion, measuring wall time; kills it after `timeout_s`.

    With `capture=False` stdout goes to /dev/null (for commands such as `pigz -c`
    whose output is data, not a report); stderr is still captured.
    """
    started = time.monotonic()
    process, token = start(
        argv,
        stack,
        os.path.basename(argv[0]),
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as error:
        stop_process_group(process)
        raise CommandError(f"{' '.join(argv)} did not finish within {timeout_s:.0f} s") from error
    finally:
        stack.run_one(token)
    wall_s = time.monotonic() - started
    return Completed(argv, process.returncode, stdout or "", stderr or "", wall_s)


def tail(text: str, lines: int = 5) -> str:
    """Last `lines` non-empty lines, joined with ' | ' for one-line error reports."""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])
