"""The test bed's command line: run, smoke, summarize, pool.

Why it exists: it is the wiring between the user's command and the parts (experiment,
runner, summary) and turns a TestbedError into one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .errors import TestbedError
from .experiment import SETTINGS, GuestSpec, guest_command, load_experiment
from .guest import GuestSet, parse_result
from .lock import RunLock, install_signal_handlers
from .runner import check_image, run_experiment
from .summary import pool_markdown, write_summary

HERE = Path(__file__).resolve().parent.parent
DEFAULT_IMAGE_DIR = HERE / "build"
DEFAULT_RESULTS_DIR = HERE / "results"
# The smoke test's Gleaner mode. Retention mode starts its back end before the workload,
# whatever the policy decides; in the TCG guest (no cpuidle poll state) that is the pinned
# SCHED_IDLE threads, the part of gleaner that depends most on the libc it is linked with.
SMOKE_MODE = "retention"


def cmd_run(args) -> int:
    exp = load_experiment(args.experiment)
    if args.repetitions:
        exp.repetitions = args.repetitions
    if args.duration_s:
        exp.duration_s = args.duration_s
    if args.pin_vcpus is not None:
        exp.pin_vcpus = args.pin_vcpus
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


def cmd_pool(args) -> int:
    print(pool_markdown(args.results_dirs), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Oversubscribed test bed: real Linux guests under QEMU sharing this machine's CPUs.")
    parser.add_argument("--image", type=Path, default=DEFAULT_IMAGE_DIR, help="image dir (testbed/build)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run an experiment file")
    p_run.add_argument("experiment", type=Path)
    p_run.add_argument("--results", type=Path, default=DEFAULT_RESULTS_DIR)
    p_run.add_argument("--repetitions", type=int, help="override the file's repetitions")
    p_run.add_argument("--duration-s", type=float, help="override the file's duration_s")
    p_run.add_argument("--pin-vcpus", action=argparse.BooleanOptionalAction, default=None,
                       help="override the file's pin_vcpus (summary.md says which placement ran)")
    p_run.set_defaults(func=cmd_run)
    p_smoke = sub.add_parser("smoke", help="one guest boots, runs a 1 s pipeline under gleaner run, powers off")
    p_smoke.set_defaults(func=cmd_smoke)
    p_sum = sub.add_parser("summarize", help="redo summary.md/json and the plot of a results dir")
    p_sum.add_argument("results_dir", type=Path)
    p_sum.set_defaults(func=cmd_summarize)
    p_pool = sub.add_parser("pool", help="summarise the pairs of several results dirs of one experiment together")
    p_pool.add_argument("results_dirs", type=Path, nargs="+")
    p_pool.set_defaults(func=cmd_pool)
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
