"""One QEMU guest and its serial console, and a set of guests that never outlives the driver.

Why it exists: the guest agent (testbed/guest/init) speaks a line protocol on the serial
console; this module starts QEMU, picks the agent's lines out of boot noise, and makes sure
every QEMU process is killed and reaped on every exit path.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

from .errors import TestbedError
from .experiment import GuestSpec
from .hostproc import ThreadStats, read_thread_stats

QEMU = os.environ.get("GLEANER_TESTBED_QEMU", "qemu-system-x86_64")


def _die_with_parent() -> None:
    """Runs in the QEMU child before exec: SIGKILL it if the driver dies, even by SIGKILL."""
    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Guest:
    """One QEMU process whose serial console is the agent's command line."""

    def __init__(self, spec: GuestSpec, image_dir: Path, log_path: Path):
        self.spec = spec
        # (host monotonic time the line arrived, line); None when QEMU's output ends.
        self.lines: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self.last_arrival = 0.0
        self.log = open(log_path, "w", buffering=1)
        cmd = [
            QEMU,
            "-name", f"{spec.name},debug-threads=on",
            "-accel", "tcg,thread=multi",
            "-smp", str(spec.vcpus),
            "-m", str(spec.memory_mib),
            "-kernel", str(image_dir / "vmlinuz"),
            "-initrd", str(image_dir / "initramfs.cpio.gz"),
            "-append", "console=ttyS0 quiet loglevel=1 panic=-1",
            "-nodefaults", "-no-reboot",
            "-display", "none",
            "-monitor", "none",
            "-serial", "stdio",
        ]  # fmt: skip
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        except OSError as err:
            self.log.close()
            raise TestbedError(f"cannot start {QEMU}: {err.strerror}; run testbed/setup.sh") from err
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.log.write(line + "\n")
            if line.startswith("TB-"):
                self.lines.put((time.monotonic(), line))
        self.lines.put(None)  # end of output: QEMU exited

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((line + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError as err:
            raise TestbedError(f"guest {self.spec.name}: QEMU exited; see its serial log") from err

    def expect(self, prefix: str, timeout_s: float) -> str:
        """The next agent line starting with `prefix`; its arrival time goes to `last_arrival`."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TestbedError(
                    f"guest {self.spec.name}: no '{prefix}' within {timeout_s:.0f} s; "
                    f"see {self.log.name}, or raise boot_timeout_s/duration_s"
                )
            try:
                item = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if item is None:
                raise TestbedError(f"guest {self.spec.name}: QEMU exited early; see {self.log.name}")
            arrival, line = item
            if line.startswith(prefix):
                self.last_arrival = arrival
                return line

    def vcpu_stats(self) -> dict[str, ThreadStats]:
        return read_thread_stats(Path("/proc"), self.proc.pid)

    def power_off(self, timeout_s: float = 30) -> None:
        if self.proc.poll() is None:
            try:
                self.send("POWEROFF")
                self.proc.wait(timeout=timeout_s)
            except (TestbedError, subprocess.TimeoutExpired):
                pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.reader.join(timeout=5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass  # unsent input to a dead QEMU
        self.log.close()


class GuestSet:
    """Context manager: every guest is killed and reaped on every exit path."""

    def __init__(self):
        self.guests: list[Guest] = []

    def __enter__(self) -> "GuestSet":
        return self

    def start(self, spec: GuestSpec, image_dir: Path, log_path: Path) -> Guest:
        guest = Guest(spec, image_dir, log_path)
        self.guests.append(guest)
        return guest

    def __exit__(self, *exc) -> None:
        for guest in self.guests:
            guest.power_off(timeout_s=0 if exc[0] else 30)
        for guest in self.guests:
            guest.kill()


def parse_result(line: str) -> tuple[int, int, dict]:
    """`TB-RESULT <id> <rc> <json>` -> (id, rc, report)."""
    parts = line.split(" ", 3)
    if len(parts) < 4:
        raise TestbedError(f"malformed agent line {line!r}; rebuild the image (testbed/build-image.sh)")
    try:
        report = json.loads(parts[3])
        return int(parts[1]), int(parts[2]), report
    except (ValueError, json.JSONDecodeError) as err:
        raise TestbedError(f"malformed agent line {line!r}: {err}") from err
