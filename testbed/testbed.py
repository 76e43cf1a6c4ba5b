#!/usr/bin/env python3
"""Oversubscribed test bed: real Linux guests under QEMU (TCG) sharing this machine's CPUs.

Why it exists: Gleaner's largest effects (paper Table 1 "Shared", §7.2, Figures 7-9) appear
when two VMs time-share the physical CPUs. We cannot change this machine's host, but we can
be the host: QEMU's multi-threaded TCG runs each vCPU as a host thread that this machine's
scheduler time-shares. This driver boots the guests of an experiment file once per case,
then runs interleaved repetitions of "Gleaner off" and "Gleaner on" inside them, starting
the workloads of all guests at the same moment through the guest agent on each serial
console (testbed/guest/init), and records per run:
  * each guest's workload report (JSON from `gleaner workload --json`),
  * each QEMU vCPU thread's CPU time and context switches from /proc (host side),
then writes per-guest speedups, the paper's weighted speedup (§7.2.1: the mean of the
benchmark's and the co-runner's speedups relative to Gleaner off), medians and ranges, a
Markdown summary and a plot under testbed/results/.

Every QEMU process dies with the driver (PR_SET_PDEATHSIG, plus explicit kill on every exit
path including Ctrl-C and SIGTERM); a lock refuses a second concurrent run.

Usage:
  testbed/testbed.py run testbed/experiments/fig7.toml       # the Figure 7 experiment
  testbed/testbed.py smoke                                    # one guest boots, runs under gleaner, powers off
  testbed/testbed.py summarize testbed/results/<run dir>      # redo tables/plot from runs.jsonl
Python 3.11+ standard library; matplotlib for the plot (skipped with a note if missing).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import queue
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_IMAGE_DIR = HERE / "build"
DEFAULT_RESULTS_DIR = HERE / "results"
LOCK_PATH = Path(os.environ.get("GLEANER_TESTBED_LOCK", "/run/lock/gleaner-testbed.lock"))
GLEANER_MODES = ("off", "full", "retention", "consolidation", "observe")
SETTINGS = ("off", "on")  # Gleaner off in every guest / each guest in its configured mode
QEMU = os.environ.get("GLEANER_TESTBED_QEMU", "qemu-system-x86_64")
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The smoke test's Gleaner mode. Retention mode starts its back end before the workload,
# whatever the policy decides; in the TCG guest (no cpuidle poll state) that is the pinned
# SCHED_IDLE threads, the part of gleaner that depends most on the libc it is linked with.
SMOKE_MODE = "retention"


class TestbedError(Exception):
    """A problem the user can fix; printed as one line naming it and the fix."""


# --------------------------------------------------------------------------- experiment file


@dataclass
class GuestSpec:
    name: str
    role: str  # "benchmark" or "corunner": which speedup is which in the summary
    vcpus: int
    memory_mib: int
    workload: list[str]  # arguments after `gleaner workload`
    gleaner: str  # mode in the "on" setting; the "off" setting always runs bare


@dataclass
class Case:
    name: str
    guests: list[GuestSpec]
    paper: dict[str, str] = field(default_factory=dict)


@dataclass
class Experiment:
    name: str
    repetitions: int
    duration_s: float
    boot_timeout_s: float
    cases: list[Case]


def _require(table: dict, key: str, kind: type, where: str):
    if key not in table:
        raise TestbedError(f"{where}: missing key '{key}'; add it")
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise TestbedError(f"{where}: '{key}' = {value!r} must be a {kind.__name__}")
    return value


def _no_unknown_keys(table: dict, allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise TestbedError(f"{where}: unknown key '{key}'; the keys are {', '.join(sorted(allowed))}")


def parse_experiment(text: str, source: str) -> Experiment:
    """Validates an experiment file; every error names the file, the key and the fix."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise TestbedError(f"{source}: not valid TOML ({err}); fix the syntax") from err
    _no_unknown_keys(doc, {"name", "repetitions", "duration_s", "boot_timeout_s", "case"}, source)
    reps = doc.get("repetitions", 3)
    duration = doc.get("duration_s", 15)
    boot_timeout = doc.get("boot_timeout_s", 180)
    if not isinstance(reps, int) or isinstance(reps, bool) or not 1 <= reps <= 100:
        raise TestbedError(f"{source}: repetitions = {reps!r} must be an integer in 1..100")
    for key, value in (("duration_s", duration), ("boot_timeout_s", boot_timeout)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 3600:
            raise TestbedError(f"{source}: {key} = {value!r} must be a number of seconds in (0, 3600]")
    cases_doc = doc.get("case")
    if not isinstance(cases_doc, list) or not cases_doc:
        raise TestbedError(f"{source}: no [[case]] tables; add at least one")
    cases = []
    for ci, case_doc in enumerate(cases_doc):
        where = f"{source}: case {ci + 1}"
        if not isinstance(case_doc, dict):
            raise TestbedError(f"{where}: must be a [[case]] table")
        _no_unknown_keys(case_doc, {"name", "guest", "paper"}, where)
        name = _require(case_doc, "name", str, where)
        guests_doc = case_doc.get("guest")
        if not isinstance(guests_doc, list) or not guests_doc:
            raise TestbedError(f"{where} ('{name}'): no [[case.guest]] tables; add at least one")
        guests = []
        for gi, g in enumerate(guests_doc):
            gwhere = f"{where} guest {gi + 1}"
            if not isinstance(g, dict):
                raise TestbedError(f"{gwhere}: must be a [[case.guest]] table")
            _no_unknown_keys(g, {"name", "role", "vcpus", "memory_mib", "workload", "gleaner"}, gwhere)
            gname = _require(g, "name", str, gwhere)
            if not gname.isidentifier():
                raise TestbedError(f"{gwhere}: name {gname!r} must be a plain word (letters, digits, _)")
            role = g.get("role", "benchmark" if gi == 0 else "corunner")
            if role not in ("benchmark", "corunner"):
                raise TestbedError(f"{gwhere}: role {role!r} must be 'benchmark' or 'corunner'")
            vcpus = g.get("vcpus", 2)
            memory = g.get("memory_mib", 384)
            if not isinstance(vcpus, int) or isinstance(vcpus, bool) or not 1 <= vcpus <= 64:
                raise TestbedError(f"{gwhere}: vcpus = {vcpus!r} must be an integer in 1..64")
            if not isinstance(memory, int) or isinstance(memory, bool) or not 128 <= memory <= 4096:
                raise TestbedError(f"{gwhere}: memory_mib = {memory!r} must be an integer in 128..4096")
            workload = shlex.split(_require(g, "workload", str, gwhere))
            if not workload:
                raise TestbedError(f"{gwhere}: workload is empty; name one, e.g. \"pipeline\"")
            if any("--duration" in word or "\n" in word for word in workload):
                raise TestbedError(f"{gwhere}: workload must not set --duration; use duration_s")
            mode = g.get("gleaner", "off")
            if mode not in GLEANER_MODES:
                raise TestbedError(f"{gwhere}: gleaner = {mode!r} must be one of {', '.join(GLEANER_MODES)}")
            guests.append(GuestSpec(gname, role, vcpus, memory, workload, mode))
        if len({g.name for g in guests}) != len(guests):
            raise TestbedError(f"{where}: guest names must be distinct")
        if [g.role for g in guests].count("benchmark") != 1:
            raise TestbedError(f"{where}: exactly one guest must have role = \"benchmark\"")
        paper = case_doc.get("paper", {})
        if not isinstance(paper, dict) or not all(isinstance(v, str) for v in paper.values()):
            raise TestbedError(f"{where}: paper must be a table of strings")
        cases.append(Case(name, guests, paper))
    name = doc.get("name", Path(source).stem)
    if not isinstance(name, str) or not name.replace("-", "_").isidentifier():
        raise TestbedError(f"{source}: name = {name!r} must be a plain word")
    return Experiment(name, reps, float(duration), float(boot_timeout), cases)


def load_experiment(path: Path) -> Experiment:
    try:
        text = path.read_text()
    except OSError as err:
        raise TestbedError(f"cannot read experiment file {path}: {err.strerror}; check the path") from err
    return parse_experiment(text, str(path))


def run_order(repetitions: int) -> list[tuple[int, str]]:
    """Interleaved (rep, setting) pairs; the first setting alternates so neither is always first."""
    order = []
    for rep in range(repetitions):
        settings = SETTINGS if rep % 2 == 0 else tuple(reversed(SETTINGS))
        order.extend((rep, s) for s in settings)
    return order


def guest_command(run_id: int, spec: GuestSpec, setting: str, duration_s: float) -> str:
    """The agent's RUN line for this guest in this setting."""
    mode = spec.gleaner if setting == "on" else "off"
    words = ["RUN", str(run_id), mode, *spec.workload, "--duration", f"{duration_s:g}s"]
    return " ".join(words)


# --------------------------------------------------------------------------- host side /proc


@dataclass
class ThreadStats:
    cpu_s: float
    voluntary_switches: int
    involuntary_switches: int


def read_thread_stats(proc_root: Path, pid: int) -> dict[str, ThreadStats]:
    """CPU time and context switches of each QEMU vCPU thread, keyed by its name ("CPU 0/TCG").

    QEMU names its threads when started with `-name ...,debug-threads=on`. Threads that exit
    between listing and reading are skipped.
    """
    stats = {}
    task_dir = proc_root / str(pid) / "task"
    try:
        tids = sorted(os.listdir(task_dir))
    except OSError:
        return stats
    for tid in tids:
        try:
            comm = (task_dir / tid / "comm").read_text().strip()
            if not comm.startswith("CPU "):
                continue
            stat = (task_dir / tid / "stat").read_text()
            status = (task_dir / tid / "status").read_text()
        except OSError:
            continue
        # Fields after the parenthesised comm; utime and stime are fields 14 and 15.
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / CLK_TCK
        switches = {}
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                switches[key] = int(value)
        stats[comm] = ThreadStats(
            cpu_s,
            switches.get("voluntary_ctxt_switches", 0),
            switches.get("nonvoluntary_ctxt_switches", 0),
        )
    return stats


def stats_delta(before: dict[str, ThreadStats], after: dict[str, ThreadStats]) -> dict[str, dict]:
    out = {}
    for name, end in sorted(after.items()):
        start = before.get(name, ThreadStats(0.0, 0, 0))
        out[name] = {
            "cpu_s": round(end.cpu_s - start.cpu_s, 3),
            "voluntary_switches": end.voluntary_switches - start.voluntary_switches,
            "involuntary_switches": end.involuntary_switches - start.involuntary_switches,
        }
    return out


# --------------------------------------------------------------------------- guests


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


# --------------------------------------------------------------------------- lock and signals


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


# --------------------------------------------------------------------------- running


def check_image(image_dir: Path) -> dict:
    manifest_path = image_dir / "manifest.json"
    for name in ("vmlinuz", "initramfs.cpio.gz", "manifest.json"):
        if not (image_dir / name).is_file():
            raise TestbedError(f"{image_dir / name} is missing; build the image: testbed/build-image.sh")
    try:
        return json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise TestbedError(f"{manifest_path} is unreadable ({err}); rebuild: testbed/build-image.sh") from err


def boot_all(guests: GuestSet, case: Case, image_dir: Path, out_dir: Path, timeout_s: float) -> list[Guest]:
    started = [guests.start(spec, image_dir, out_dir / f"serial-{case.name}-{spec.name}.log") for spec in case.guests]
    for guest in started:
        ready = guest.expect("TB-READY", timeout_s)
        cpus = int(ready.split()[1])
        if cpus != guest.spec.vcpus:
            raise TestbedError(f"guest {guest.spec.name} sees {cpus} CPUs, expected {guest.spec.vcpus}")
    return started


def window_overlap(windows: dict[str, tuple[float, float]], roles: dict[str, str]) -> float | None:
    """Fraction of the benchmark's run window during which every co-runner was running too.

    Workloads start together, but `gleaner run` may spend a moment (e.g. calibrating) before
    starting its workload; a benchmark window not covered by the co-runner would run partly
    uncontended and flatter Gleaner, so the summary reports this.
    """
    bench = [w for n, w in windows.items() if roles[n] == "benchmark"]
    others = [w for n, w in windows.items() if roles[n] != "benchmark"]
    if not bench or not others or bench[0][1] <= bench[0][0]:
        return None
    start, end = bench[0]
    covered = min(max(0.0, min(end, o_end) - max(start, o_start)) for o_start, o_end in others)
    return covered / (end - start)


def run_once(guests: list[Guest], run_id: int, setting: str, duration_s: float) -> dict:
    """Starts every guest's workload at the same moment and collects reports and host stats.

    Each workload's window on the host clock is [arrival of its result - its elapsed time,
    arrival], seconds after the start commands were sent.
    """
    before = {g.spec.name: g.vcpu_stats() for g in guests}
    start = time.monotonic()
    for guest in guests:
        guest.send(guest_command(run_id, guest.spec, setting, duration_s))
    per_guest = {}
    windows = {}
    for guest in guests:
        # Generous: gleaner run may measure wake latency before starting, and TCG is slow.
        line = guest.expect(f"TB-RESULT {run_id} ", duration_s * 3 + 120)
        _, rc, report = parse_result(line)
        arrival = guest.last_arrival - start
        elapsed = report.get("elapsed_s", 0.0)
        windows[guest.spec.name] = (arrival - elapsed, arrival)
        per_guest[guest.spec.name] = {
            "role": guest.spec.role,
            "mode": guest.spec.gleaner if setting == "on" else "off",
            "rc": rc,
            "report": report,
            "window_s": [round(arrival - elapsed, 3), round(arrival, 3)],
            "vcpu_threads": stats_delta(before[guest.spec.name], guest.vcpu_stats()),
        }
        if rc != 0:
            print(f"testbed: guest {guest.spec.name} run {run_id} exited {rc}; see its serial log", file=sys.stderr)
    overlap = window_overlap(windows, {g.spec.name: g.spec.role for g in guests})
    return {
        "wall_s": round(time.monotonic() - start, 3),
        "overlap": None if overlap is None else round(overlap, 4),
        "guests": per_guest,
    }


def run_experiment(exp: Experiment, image_dir: Path, out_dir: Path) -> Path:
    manifest = check_image(image_dir)
    out_dir.mkdir(parents=True, exist_ok=False)
    (out_dir / "image-manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    runs_path = out_dir / "runs.jsonl"
    run_id = 0
    with open(runs_path, "w", buffering=1) as runs:
        for case in exp.cases:
            print(f"testbed: case {case.name}: booting {len(case.guests)} guest(s)", file=sys.stderr)
            with GuestSet() as guest_set:
                guests = boot_all(guest_set, case, image_dir, out_dir, exp.boot_timeout_s)
                # A short unrecorded run in the "on" setting: fails fast on a broken workload
                # or mode, and lets gleaner cache its retention calibration while quiet.
                run_id += 1
                warmup = run_once(guests, run_id, "on", min(2.0, exp.duration_s))
                failed = [n for n, g in warmup["guests"].items() if g["rc"] != 0]
                if failed:
                    raise TestbedError(
                        f"case {case.name}: warm-up failed in guest(s) {', '.join(failed)}; "
                        f"see the TB-LOG lines in {out_dir}/serial-{case.name}-*.log"
                    )
                for rep, setting in run_order(exp.repetitions):
                    run_id += 1
                    result = run_once(guests, run_id, setting, exp.duration_s)
                    record = {"case": case.name, "rep": rep, "setting": setting, "run_id": run_id, **result}
                    runs.write(json.dumps(record) + "\n")
                    bench = next(g for g in case.guests if g.role == "benchmark").name
                    tput = result["guests"][bench]["report"].get("throughput_per_s", float("nan"))
                    print(f"testbed: {case.name} rep {rep + 1}/{exp.repetitions} gleaner {setting}: "
                          f"{bench} {tput:.1f}/s", file=sys.stderr)  # fmt: skip
    return runs_path


# --------------------------------------------------------------------------- summary


def _spread(values: list[float]) -> dict:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarize(records: list[dict], cases_paper: dict[str, dict] | None = None) -> dict:
    """Per case: per-guest throughput by setting, speedups of on over off and the weighted speedup.

    Speedups are formed per repetition from the adjacent off/on pair (they ran back to back
    in the same booted guests), then summarised by median and range over repetitions.
    """
    summary = {}
    records = [r for r in records if r["setting"] in SETTINGS]
    for case in dict.fromkeys(r["case"] for r in records):
        by_rep: dict[int, dict[str, dict]] = {}
        for r in records:
            if r["case"] == case:
                by_rep.setdefault(r["rep"], {})[r["setting"]] = r
        first = next(r for r in records if r["case"] == case)
        roles = {name: g["role"] for name, g in sorted(first["guests"].items())}
        throughput = {name: {s: [] for s in SETTINGS} for name in roles}
        speedups = {name: [] for name in roles}
        weighted = []
        # Host view of each guest's vCPU threads, per setting: CPU seconds per wall second
        # and context switches per wall second (what retention and consolidation change).
        vcpu_cpu = {name: {s: [] for s in SETTINGS} for name in roles}
        vcpu_switches = {name: {s: [] for s in SETTINGS} for name in roles}
        overlap = {s: [] for s in SETTINGS}
        for rep in sorted(by_rep):
            pair = by_rep[rep]
            if set(pair) != set(SETTINGS):
                continue  # an interrupted repetition has only one setting
            ok = all(
                pair[s]["guests"][n]["rc"] == 0 and pair[s]["guests"][n]["report"].get("throughput_per_s", 0) > 0
                for s in SETTINGS
                for n in roles
            )
            if not ok:
                continue
            rep_speedups = []
            for setting in SETTINGS:
                run = pair[setting]
                if run.get("overlap") is not None:
                    overlap[setting].append(run["overlap"])
                wall = run.get("wall_s", 0)
                for name in roles:
                    threads = run["guests"][name].get("vcpu_threads", {})
                    if wall > 0 and threads:
                        vcpu_cpu[name][setting].append(sum(t["cpu_s"] for t in threads.values()) / wall)
                        switches = sum(t["voluntary_switches"] + t["involuntary_switches"] for t in threads.values())
                        vcpu_switches[name][setting].append(switches / wall)
            for name in roles:
                off = pair["off"]["guests"][name]["report"]["throughput_per_s"]
                on = pair["on"]["guests"][name]["report"]["throughput_per_s"]
                throughput[name]["off"].append(off)
                throughput[name]["on"].append(on)
                speedups[name].append(on / off)
                rep_speedups.append(on / off)
            weighted.append(sum(rep_speedups) / len(rep_speedups))
        summary[case] = {
            "roles": roles,
            "throughput_per_s": {n: {s: _spread(v) for s, v in t.items() if v} for n, t in throughput.items()},
            "speedup": {n: _spread(v) for n, v in speedups.items() if v},
            "weighted_speedup": _spread(weighted) if weighted else None,
            "vcpu_cpu_per_s": {n: {s: _spread(v) for s, v in t.items() if v} for n, t in vcpu_cpu.items()},
            "vcpu_switches_per_s": {n: {s: _spread(v) for s, v in t.items() if v} for n, t in vcpu_switches.items()},
            "window_overlap": {s: _spread(v) for s, v in overlap.items() if v},
            "paper": (cases_paper or {}).get(case, {}),
        }
    return summary


def _fmt(spread: dict | None, digits: int = 2) -> str:
    if not spread:
        return "n/a"
    return f"{spread['median']:.{digits}f} [{spread['min']:.{digits}f}, {spread['max']:.{digits}f}]"


def summary_markdown(summary: dict, manifest: dict, exp_name: str) -> str:
    lines = [
        f"# Test bed: {exp_name}",
        "",
        f"Image {manifest.get('image_sha256', '?')} ({manifest.get('kernel_package', '?')}, "
        f"gleaner {manifest.get('git_commit', '?')[:12]}).",
        "Speedup = throughput with Gleaner on / off, paired per interleaved repetition; "
        "weighted speedup = mean of the guests' speedups (paper §7.2.1). Median [min, max].",
        "",
        "| case | benchmark speedup | co-runner speedup | weighted speedup | paper |",
        "|---|---|---|---|---|",
    ]
    for case, s in summary.items():
        bench = [n for n, r in s["roles"].items() if r == "benchmark"]
        corun = [n for n, r in s["roles"].items() if r == "corunner"]
        paper = "; ".join(f"{k}: {v}" for k, v in s["paper"].items()) or "-"
        lines.append(
            f"| {case} | {_fmt(s['speedup'].get(bench[0]))} | "
            f"{', '.join(_fmt(s['speedup'].get(n)) for n in corun) or '-'} | "
            f"{_fmt(s['weighted_speedup'])} | {paper} |"
        )
    lines += [
        "",
        "Per guest, Gleaner off / on: workload throughput; host CPU seconds of its QEMU vCPU threads",
        "per wall second; their context switches per wall second.",
        "",
        "| case | guest | throughput off (ops/s) | on | vCPU CPU/s off | on | vCPU switches/s off | on |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, s in summary.items():
        for name, t in s["throughput_per_s"].items():
            cpu = s.get("vcpu_cpu_per_s", {}).get(name, {})
            sw = s.get("vcpu_switches_per_s", {}).get(name, {})
            lines.append(
                f"| {case} | {name} | {_fmt(t.get('off'))} | {_fmt(t.get('on'))} | "
                f"{_fmt(cpu.get('off'))} | {_fmt(cpu.get('on'))} | {_fmt(sw.get('off'), 0)} | {_fmt(sw.get('on'), 0)} |"
            )
    lines += ["", "Fraction of the benchmark's run window with the co-runner running too (1 = fully contended):", ""]
    for case, s in summary.items():
        ov = s.get("window_overlap", {})
        lines.append(f"* {case}: off {_fmt(ov.get('off'))}, on {_fmt(ov.get('on'))}")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> str | None:
    """Bars of median speedups with min-max whiskers; returns why not when it cannot plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (testbed/setup.sh installs it)"
    cases = list(summary)
    series = [("benchmark", "benchmark"), ("co-runner", "corunner"), ("weighted", None)]
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(cases), 3.2))
    width = 0.8 / len(series)
    for i, (label, role) in enumerate(series):
        meds, errs = [], [[], []]
        for case in cases:
            s = summary[case]
            if role is None:
                spread = s["weighted_speedup"]
            else:
                names = [n for n, r in s["roles"].items() if r == role]
                spread = s["speedup"].get(names[0]) if names else None
            med = spread["median"] if spread else float("nan")
            meds.append(med)
            errs[0].append(med - spread["min"] if spread else 0)
            errs[1].append(spread["max"] - med if spread else 0)
        xs = [c + (i - 1) * width for c in range(len(cases))]
        ax.bar(xs, meds, width, yerr=errs, capsize=3, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(cases)), cases)
    ax.set_ylabel("speedup, Gleaner on / off")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_summary(out_dir: Path, exp: Experiment | None) -> Path:
    runs_path = out_dir / "runs.jsonl"
    try:
        records = [json.loads(line) for line in runs_path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as err:
        raise TestbedError(f"cannot read {runs_path}: {err}; is this a test bed results directory?") from err
    if not records:
        raise TestbedError(f"{runs_path} holds no runs; nothing to summarise")
    if exp is None and (out_dir / "experiment.toml").is_file():
        exp = load_experiment(out_dir / "experiment.toml")
    papers = {c.name: c.paper for c in exp.cases} if exp else {}
    summary = summarize(records, papers)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    manifest_path = out_dir / "image-manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    md = summary_markdown(summary, manifest, exp.name if exp else out_dir.name)
    why_not = plot(summary, out_dir / "speedup.png")
    if why_not:
        md += f"\nNo plot: {why_not}.\n"
    else:
        md += "\n![speedups](speedup.png)\n"
    (out_dir / "summary.md").write_text(md)
    return out_dir / "summary.md"


# --------------------------------------------------------------------------- commands


def cmd_run(args) -> int:
    exp = load_experiment(args.experiment)
    if args.repetitions:
        exp.repetitions = args.repetitions
    if args.duration_s:
        exp.duration_s = args.duration_s
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = args.results / f"{exp.name}-{stamp}"
    runs = len(exp.cases) * exp.repetitions * len(SETTINGS)
    print(f"testbed: {runs} runs of {exp.duration_s:g} s; results in {out_dir}", file=sys.stderr)
    with RunLock():
        try:
            run_experiment(exp, args.image, out_dir)
        finally:
            if (out_dir / "runs.jsonl").is_file():
                (out_dir / "experiment.toml").write_text(args.experiment.read_text())
    summary = write_summary(out_dir, exp)
    print(summary.read_text())
    return 0


def cmd_smoke(args) -> int:
    """One guest boots, runs a 1 s pipeline under `gleaner run --mode retention`, powers off.

    Under Gleaner, not bare: the image's gleaner must start its retention threads (SCHED_IDLE,
    pinned) and manage a workload, so a gleaner that builds but cannot run in the guest (e.g.
    a musl libc stub failing with ENOSYS) fails here and not minutes into an experiment.
    """
    check_image(args.image)
    spec = GuestSpec("smoke", "benchmark", 2, 256, ["pipeline"], SMOKE_MODE)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    log_path = log_dir / f"gleaner-testbed-smoke-{os.getpid()}.log"
    start = time.monotonic()
    ok = False
    try:
        with RunLock(), GuestSet() as guests:
            guest = guests.start(spec, args.image, log_path)
            ready = guest.expect("TB-READY", 100)
            boot_s = time.monotonic() - start
            guest.send(guest_command(1, spec, "on", 1))
            _, rc, report = parse_result(guest.expect("TB-RESULT 1 ", 60))
            print(json.dumps(report))
            guest.send("POWEROFF")
            guest.proc.wait(timeout=30)
            ok = rc == 0 and report.get("ops", 0) > 0 and guest.proc.returncode == 0
            print(f"testbed smoke: {'ok' if ok else 'FAILED'}: {ready.removeprefix('TB-READY ')}, "
                  f"boot {boot_s:.1f} s, total {time.monotonic() - start:.1f} s, "
                  f"workload under gleaner run --mode {SMOKE_MODE} rc {rc}, "
                  f"qemu rc {guest.proc.returncode}", file=sys.stderr)  # fmt: skip
    finally:
        if ok:
            log_path.unlink(missing_ok=True)
        else:
            for line in _agent_logs(log_path, 1):
                print(f"testbed smoke: guest: {line}", file=sys.stderr)
            print(f"testbed smoke: serial log kept at {log_path}", file=sys.stderr)
    return 0 if ok else 1


def _agent_logs(log_path: Path, run_id: int) -> list[str]:
    """The agent's TB-LOG lines (the failed command's stderr) for `run_id` in a serial log."""
    prefix = f"TB-LOG {run_id} "
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return []
    return [line.removeprefix(prefix) for line in text.splitlines() if line.startswith(prefix)]


def cmd_summarize(args) -> int:
    print(write_summary(args.results_dir, None).read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", type=Path, default=DEFAULT_IMAGE_DIR, help="image dir (testbed/build)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run an experiment file")
    p_run.add_argument("experiment", type=Path)
    p_run.add_argument("--results", type=Path, default=DEFAULT_RESULTS_DIR)
    p_run.add_argument("--repetitions", type=int, help="override the file's repetitions")
    p_run.add_argument("--duration-s", type=float, help="override the file's duration_s")
    p_run.set_defaults(func=cmd_run)
    p_smoke = sub.add_parser("smoke", help="one guest boots, runs a 1 s pipeline under gleaner run, powers off")
    p_smoke.set_defaults(func=cmd_smoke)
    p_sum = sub.add_parser("summarize", help="redo summary.md/json and the plot of a results dir")
    p_sum.add_argument("results_dir", type=Path)
    p_sum.set_defaults(func=cmd_summarize)
    args = parser.parse_args(argv)
    install_signal_handlers()
    try:
        return args.func(args)
    except TestbedError as err:
        print(f"testbed: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("testbed: interrupted; all guests stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
