#!/usr/bin/env python3
"""Entry point of the Gleaner benchmark harness: `python3 bench/run.py quick|full`.

Runs the named suite with every configuration interleaved, and writes
results/<suite>-<date>.json, .md and -*.png. Progress goes to stderr. See
bench/README.md for the suites, configurations and outputs.
"""

from __future__ import annotations

import argparse
import subprocess
import shutil
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import preflight  # noqa: E402
from harness.cleanup import STACK  # noqa: E402
from harness.configs import CONFIG_NAMES, select_configs  # noqa: E402
from harness.haltpoll import haltpoll_status  # noqa: E402
from harness.runner import Options, config_statuses, log, run_suite  # noqa: E402
from harness.suites import QUICK_BUDGET_S, SUITES  # noqa: E402
from harness.workloads import OltpWorkload  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=sorted(SUITES), help="which suite to run")
    parser.add_argument("--reps", type=int, help="repetitions per configuration (default: the suite's, 5)")
    parser.add_argument("--workloads", help="comma-separated subset of the suite's workloads")
    parser.add_argument("--configs",
                        help=f"comma-separated subset of: {','.join(CONFIG_NAMES)} (must include baseline)")
    parser.add_argument("--gleaner", type=Path, default=preflight.DEFAULT_GLEANER, help="gleaner CLI binary")
    parser.add_argument("--results-dir", type=Path, default=preflight.REPO_ROOT / "results")
    parser.add_argument("--no-setup", action="store_true", help="never run bench/setup.sh; just say what is missing")
    parser.add_argument("--haltpoll-anyway", action="store_true",
                        help="run the haltpoll configuration even where it cannot take effect (labelled ineffective)")
    parser.add_argument("--list", action="store_true", help="print the plan and time estimate, run nothing")
    return parser.parse_args(argv)


def split(text: str | None) -> list[str] | None:
    return [part.strip() for part in text.split(",") if part.strip()] if text else None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    suite = SUITES[args.suite]()
    try:
        configs = select_configs(split(args.configs))
    except ValueError as error:
        log(f"error: {error}")
        return 2
    wanted = split(args.workloads)
    if wanted:
        known = {workload.name for workload in suite.workloads}
        unknown = [name for name in wanted if name not in known]
        if unknown:
            log(f"error: suite {suite.name} has no workload {', '.join(unknown)}; it has {', '.join(sorted(known))}")
            return 2
        suite = dataclasses.replace(suite, workloads=tuple(w for w in suite.workloads if w.name in wanted))
    reps = args.reps if args.reps is not None else suite.reps
    if reps < 1:
        log(f"error: --reps must be at least 1, got {reps}")
        return 2
    if reps < 5:
        log(f"note: {reps} repetition(s) is a plumbing check, not a measurement (suites use 5)")

    status = haltpoll_status()
    options = Options(suite, configs, reps, args.gleaner, args.results_dir, status, args.haltpoll_anyway)
    runnable, _ = config_statuses(options)
    estimate = suite.estimate_s(len(runnable), reps)
    if args.list:
        print(f"suite {suite.name}: {suite.description}")
        print(f"configurations (interleaved): {', '.join(c.name for c in runnable)}")
        print(f"haltpoll: {status.label()}")
        for workload in suite.workloads:
            print(f"  {workload.name}: {workload.description} [{workload.unit}]")
        print(f"repetitions: {reps}; estimated {estimate / 60:.1f} min")
        return 0
    if suite.name == "quick" and estimate > QUICK_BUDGET_S:
        log(f"warning: estimated {estimate / 60:.1f} min exceeds the quick suite's 10-minute budget")

    tools = {tool for workload in suite.workloads for tool in workload.tools}
    if any(config.name == "one-vcpu" for config in runnable):
        tools.add("taskset")
    uses_gleaner = any(config.uses_gleaner for config in runnable)
    try:
        preflight.ensure_tools(tools, allow_setup=not args.no_setup)
        bundled = tuple(
            (w.argv[2], tuple(preflight.long_flags(w.argv[3:]))) for w in suite.workloads if w.needs_gleaner
        )
        if uses_gleaner or bundled:
            phase = (("pipeline", ("--phases", "--json")),) if uses_gleaner and suite.phase_run else ()
            needs = preflight.GleanerNeeds(
                run_timeline=any(config.records_timeline for config in runnable),
                modes=tuple(mode for config in runnable for mode in preflight.GLEANER_MODES if mode in config.prefix),
                probe=uses_gleaner,
                probe_flags=tuple(preflight.long_flags(list(suite.probe_args))),
                workloads=bundled + phase,
            )
            if args.gleaner == preflight.DEFAULT_GLEANER and not args.gleaner.is_file() and shutil.which("cargo"):
                # A fresh clone: build the CLI the suite runs, so one command does everything.
                log("building target/release/gleaner (cargo build --release -p gleaner)")
                subprocess.run(["cargo", "build", "--release", "-p", "gleaner"], cwd=preflight.REPO_ROOT, check=False)
            preflight.check_gleaner(args.gleaner, needs)
    except preflight.PreflightError as error:
        log(f"error: {error}")
        return 1
    if any(isinstance(w, OltpWorkload) for w in suite.workloads) and os.geteuid() != 0:
        log("error: the OLTP workloads start mariadbd --user=mysql, which needs root; run as root "
            "or leave them out with --workloads")
        return 1

    try:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        probe_file = args.results_dir / ".write-test"
        probe_file.write_text("")
        probe_file.unlink()
    except OSError as error:
        log(f"error: cannot write results to {args.results_dir} ({error}); pass a writable --results-dir")
        return 1

    STACK.install()
    try:
        written = run_suite(options, STACK)
    except OSError as error:  # e.g. an unwritable --results-dir; state is restored below
        log(f"error: {error}")
        return 1
    finally:
        STACK.run_all()
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
