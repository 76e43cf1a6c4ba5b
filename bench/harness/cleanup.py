"""Restore-on-exit bookkeeping for everything the harness changes or starts.

The harness writes a kernel parameter (haltpoll), starts a MariaDB server and runs
child processes that may hold cgroups. Each of those must be undone on *every* exit
path: normal return, exception, Ctrl-C, SIGTERM/SIGHUP and interpreter exit. A single
stack of undo actions, drained by `finally` blocks, by signal handlers and by `atexit`,
gives one place where that guarantee lives. Every action runs at most once, so the
paths may overlap freely (a signal handler drains the stack, then the unwinding
`finally` blocks find nothing left to do).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class CleanupStack:
    """LIFO of labelled undo actions; each action runs at most once."""

    def __init__(self) -> None:
        self._actions: dict[int, tuple[str, Callable[[], None]]] = {}
        self._ids = itertools.count()
        self._draining = False

    def push(self, label: str, action: Callable[[], None]) -> int:
        """Registers `action`; returns a token for `run_one`."""
        token = next(self._ids)
        self._actions[token] = (label, action)
        return token

    def pending(self) -> list[str]:
        """Labels of actions not yet run, oldest first."""
        return [label for _, (label, _) in sorted(self._actions.items())]

    def run_one(self, token: int) -> None:
        """Runs the action for `token` if it has not run yet (errors propagate)."""
        entry = self._actions.pop(token, None)
        if entry is not None:
            entry[1]()

    def discard(self, token: int) -> None:
        """Deregisters the action for `token` without running it (its owner took over)."""
        self._actions.pop(token, None)

    def run_all(self) -> None:
        """Runs every pending action, newest first; one failure does not stop the rest."""
        while self._actions:
            token = max(self._actions)
            label, action = self._actions.pop(token)
            try:
                action()
            except Exception as error:  # noqa: BLE001 - keep restoring the others
                print(f"bench: cleanup '{label}' failed: {error}", file=sys.stderr)

    @contextlib.contextmanager
    def scoped(self, label: str, action: Callable[[], None]) -> Iterator[None]:
        """Context manager: `action` runs when the block exits, however it exits."""
        token = self.push(label, action)
        try:
            yield
        finally:
            self.run_one(token)

    def install(self) -> None:
        """Drains the stack at interpreter exit and on SIGINT/SIGTERM/SIGHUP.

        A handled signal drains the stack and then exits with 128+signal, the shell's
        convention, so callers can tell an interrupted suite from a finished one.
        """
        atexit.register(self.run_all)
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._draining:
            return  # a second Ctrl-C while restoring must not abandon the restore
        self._draining = True
        name = signal.Signals(signum).name
        print(f"bench: {name} received, restoring state and stopping", file=sys.stderr)
        try:
            self.run_all()
        finally:
            self._draining = False
        raise SystemExit(128 + signum)


# The process-wide stack used by the harness; tests create their own instances.
STACK = CleanupStack()
