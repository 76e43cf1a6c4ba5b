"""One test bed run at a time, and signals that unwind like Ctrl-C.

Why it exists: two experiments sharing the machine's CPUs would measure each other; and a
SIGTERM or SIGHUP must run the same cleanup as Ctrl-C so no QEMU process is left behind.
"""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

from .errors import TestbedError

LOCK_PATH = Path(os.environ.get("GLEANER_TESTBED_LOCK", "/run/lock/gleaner-testbed.lock"))


class RunLock:
    """Exclusive flock on LOCK_PATH: a second test bed run refuses to start."""

    def __enter__(self) -> "RunLock":
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(LOCK_PATH, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "unknown"
            self.file.close()
            raise TestbedError(
                f"another test bed run is active (pid {holder}, lock {LOCK_PATH}); wait for it to finish"
            ) from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"{os.getpid()}\n")
        self.file.flush()
        return self

    def __exit__(self, *exc) -> None:
        self.file.truncate(0)
        self.file.close()  # closing releases the flock


def _raise_on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP unwind like Ctrl-C, so every `finally`/`with` cleanup runs."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_on_signal)
