"""Checks before a suite: tools installed, gleaner CLI capable, machine quiet.

Every check ends in either "go" or a one-line message naming the missing piece and
the exact command that fixes it, so a suite never fails twenty minutes in because a
binary or flag was absent. The gleaner CLI is checked by reading its `--help` output
for each subcommand and flag the selected configurations and workloads use.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_GLEANER = REPO_ROOT / "target" / "release" / "gleaner"
SETUP_SCRIPT = BENCH_DIR / "setup.sh"
LOAD_THRESHOLD = 0.3
GLEANER_MODES = ("retention", "consolidation", "always-yield")


class PreflightError(Exception):
    """Something the suite needs is missing; the message says how to get it."""


def missing_tools(tools: set[str], have_matplotlib: bool | None = None) -> list[str]:
    """Executables not on PATH, plus "matplotlib" when it cannot be imported."""
    missing = sorted(tool for tool in tools if shutil.which(tool) is None)
    if have_matplotlib is None:
        have_matplotlib = importlib.util.find_spec("matplotlib") is not None
    if not have_matplotlib:
        missing.append("matplotlib")
    return missing


def setup_command() -> str:
    prefix = "" if os.geteuid() == 0 else "sudo "
    return f"{prefix}PYTHON={sys.executable} {SETUP_SCRIPT}"


def ensure_tools(tools: set[str], allow_setup: bool) -> None:
    """Runs bench/setup.sh when something is missing and we may; else says how to."""
    missing = missing_tools(tools)
    if not missing:
        return
    if not allow_setup or os.geteuid() != 0:
        raise PreflightError(f"missing {', '.join(missing)}; install with: {setup_command()}")
    print(f"bench: missing {', '.join(missing)}; running {SETUP_SCRIPT}", file=sys.stderr)
    env = dict(os.environ, PYTHON=sys.executable)
    if subprocess.run(["bash", str(SETUP_SCRIPT)], env=env, check=False).returncode != 0:
        raise PreflightError(f"{SETUP_SCRIPT} failed; see its output above, fix it and rerun")
    importlib.invalidate_caches()
    still = missing_tools(tools)
    if still:
        raise PreflightError(f"still missing {', '.join(still)} after setup; install them by hand")


def _help(gleaner: Path, *subcommand: str) -> str | None:
    try:
        result = subprocess.run(
            [str(gleaner), *subcommand, "--help"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout + result.stderr if result.returncode == 0 else None


def long_flags(argv: list[str]) -> list[str]:
    """The `--flag` names used in a command line (without `=value`)."""
    return [part.split("=", 1)[0] for part in argv if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", part)]


@dataclass(frozen=True)
class GleanerNeeds:
    """What the selected suite asks of the gleaner CLI."""

    run_timeline: bool = False
    modes: tuple[str, ...] = ()
    probe: bool = False
    probe_flags: tuple[str, ...] = ()
    workloads: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (subcommand, flags)


def check_gleaner(gleaner: Path, needs: GleanerNeeds) -> None:
    """Raises PreflightError listing every missing subcommand or flag at once."""
    if not gleaner.is_file() or not os.access(gleaner, os.X_OK):
        raise PreflightError(
            f"{gleaner} not found; build it with `cargo build --release -p gleaner` "
            "(or pass --gleaner PATH, or --configs baseline,one-vcpu to run without it)"
        )
    problems = []
    if needs.run_timeline or needs.modes:
        run_help = _help(gleaner, "run")
        if run_help is None:
            problems.append("`gleaner run` subcommand")
        else:
            if needs.run_timeline and "--timeline" not in run_help:
                problems.append("`gleaner run --timeline`")
            if needs.modes and "--mode" not in run_help:
                problems.append("`gleaner run --mode`")
            problems += [f"`gleaner run --mode {mode}`" for mode in needs.modes if mode not in run_help]
    if needs.probe:
        probe_help = _help(gleaner, "probe")
        if probe_help is None:
            problems.append("`gleaner probe`")
        else:
            problems += [f"`gleaner probe {flag}`" for flag in ("--json", *needs.probe_flags) if flag not in probe_help]
    for subcommand, flags in needs.workloads:
        workload_help = _help(gleaner, "workload", subcommand)
        if workload_help is None:
            problems.append(f"`gleaner workload {subcommand}`")
            continue
        problems += [f"`gleaner workload {subcommand} {flag}`" for flag in flags if flag not in workload_help]
    if problems:
        raise PreflightError(
            f"{gleaner} lacks {', '.join(problems)}; rebuild with `cargo build --release -p gleaner` "
            "(the CLI may not have landed yet) or leave those configurations/workloads out"
        )


def read_loadavg(path: Path = Path("/proc/loadavg")) -> tuple[float, float, float]:
    fields = path.read_text().split()
    return float(fields[0]), float(fields[1]), float(fields[2])


def load_check(loadavg: tuple[float, float, float], threshold: float = LOAD_THRESHOLD) -> str | None:
    """A loud warning when the 1-minute load says the machine is busy, else None."""
    if loadavg[0] <= threshold:
        return None
    return (
        f"1-minute load average is {loadavg[0]:.2f} (> {threshold}): the machine is busy, "
        "so these measurements are not evidence; rerun on a quiet machine"
    )


def machine_facts() -> dict:
    """What a results file records about where it was measured: commit, cpuidle driver,
    kernel, load, CPUs, time."""
    def read(p: str) -> str:
        try:
            return Path(p).read_text().strip()
        except OSError:
            return "missing"

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "commit": commit,
        "cpuidle_driver": read("/sys/devices/system/cpu/cpuidle/current_driver"),
        "kernel": os.uname().release,
        "loadavg": read("/proc/loadavg"),
        "cpus": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
