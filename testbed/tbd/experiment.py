"""Experiment files: parsing, validation and the order of runs.

Why it exists: an experiment runs for many minutes, so its file is checked completely before
any guest boots, and every error names the file, the key and the fix.
"""

from __future__ import annotations

import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TestbedError

# "guard" is a diagnostic: the workload bare beside Gleaner's guard process alone.
GLEANER_MODES = ("off", "full", "retention", "consolidation", "observe", "guard")
SETTINGS = ("off", "on")  # Gleaner off in every guest / each guest in its configured mode


@dataclass
class GuestSpec:
    name: str
    role: str  # "benchmark" or "corunner": which speedup is which in the summary
    vcpus: int
    memory_mib: int
    workload: list[str]  # arguments after `gleaner workload`
    gleaner: str  # mode in the "on" setting; the "off" setting always runs bare
    # Extra `gleaner run` flags in the "on" setting (e.g. ["--period-ms=1000"]), for finding
    # which part of Gleaner costs what.
    gleaner_args: list[str] = field(default_factory=list)


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
    # Pin vCPU i of every guest to the host's i-th allowed CPU (modulo their number) once the
    # guests are up. Unpinned, the host scheduler decides which vCPU threads share a CPU, and
    # moves them, so identical runs differ by that placement as much as by anything Gleaner does.
    pin_vcpus: bool = False


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
    _no_unknown_keys(doc, {"name", "repetitions", "duration_s", "boot_timeout_s", "pin_vcpus", "case"}, source)
    reps = doc.get("repetitions", 3)
    duration = doc.get("duration_s", 15)
    boot_timeout = doc.get("boot_timeout_s", 180)
    pin_vcpus = doc.get("pin_vcpus", False)
    if not isinstance(pin_vcpus, bool):
        raise TestbedError(f"{source}: pin_vcpus = {pin_vcpus!r} must be true or false")
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
            _no_unknown_keys(g, {"name", "role", "vcpus", "memory_mib", "workload", "gleaner", "gleaner_args"}, gwhere)
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
            args = g.get("gleaner_args", [])
            # One word each, sent inside the RUN line's mode word: no spaces, commas or newlines.
            if not isinstance(args, list) or not all(
                isinstance(a, str) and a.startswith("--") and not any(c in a for c in " ,\n\t") for a in args
            ):
                raise TestbedError(f"{gwhere}: gleaner_args = {args!r} must be a list of single-word flags such as \"--period-ms=1000\"")
            if args and mode == "off":
                raise TestbedError(f"{gwhere}: gleaner_args need a gleaner mode other than \"off\"")
            guests.append(GuestSpec(gname, role, vcpus, memory, workload, mode, list(args)))
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
    return Experiment(name, reps, float(duration), float(boot_timeout), cases, pin_vcpus)


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
    # The agent splits the mode word at commas: the mode, then extra `gleaner run` flags.
    mode = ",".join([spec.gleaner, *spec.gleaner_args]) if setting == "on" else "off"
    words = ["RUN", str(run_id), mode, *spec.workload, "--duration", f"{duration_s:g}s"]
    return " ".join(words)
