"""Running a suite end to end and writing its JSON, Markdown and PNG outputs.

The runner owns the order of runs (interleaved configurations), the per-run records
(metric, wall time, idle rates, gleaner timeline, error), progress on stderr, and the
guarantee that every temporary change is undone: the scratch directory, the haltpoll
parameter and any child process all sit on the cleanup stack. The JSON is rewritten
after each run so an interrupted suite still leaves what it measured.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import parse, proc, report
from .cleanup import CleanupStack
from .configs import Config, interleave
from .haltpoll import HALT_POLL_NS, JOURNAL_DIR, PARAM_PATH, HaltpollError, HaltpollStatus, ParamOverride, restore_stale
from .idle import IdleEntryReader, IdleSourceError
from .mariadb import MariaDBError
from .preflight import LOAD_THRESHOLD, load_check, read_loadavg
from .suites import Suite
from .workloads import RunContext, Workload, WorkloadError


@dataclass
class Options:
    suite: Suite
    configs: list[Config]
    reps: int
    gleaner: Path
    results_dir: Path
    haltpoll: HaltpollStatus
    haltpoll_anyway: bool = False
    haltpoll_param: Path = PARAM_PATH  # tests point this at a fake file
    # Where the override records the value to restore, and where a start looks for records a
    # killed run left. A test points it at its own directory: with the real one, a record of
    # the real parameter would be restored onto the machine by a test's suite start.
    haltpoll_journal: Path = JOURNAL_DIR


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def output_stem(results_dir: Path, suite: str, now: datetime.datetime) -> Path:
    """results/<suite>-<date>, with the time appended if that name is taken today."""
    stem = results_dir / f"{suite}-{now:%Y-%m-%d}"
    if stem.with_suffix(".json").exists():
        stem = results_dir / f"{suite}-{now:%Y-%m-%d-%H%M%S}"
    return stem


def config_statuses(options: Options) -> tuple[list[Config], list[dict]]:
    """Which selected configurations actually run, with the reason for any skipped."""
    runnable, records = [], []
    for config in options.configs:
        record = {"name": config.name, "description": config.description, "status": "ran", "reason": ""}
        if config.sets_haltpoll:
            status = options.haltpoll
            record["note"] = status.label()
            if not status.runnable:
                record.update(status="skipped", reason=status.reason)
            elif not status.effective and not options.haltpoll_anyway:
                record.update(status="skipped", reason=f"{status.reason} (run it anyway with --haltpoll-anyway)")
            elif not status.effective:
                record["description"] += " — INEFFECTIVE here, effectively a second baseline"
        if record["status"] == "ran":
            runnable.append(config)
        records.append(record)
    return runnable, records


def host_info(haltpoll: HaltpollStatus) -> dict:
    return {
        "commit": source_commit(),
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "cpuidle_driver": haltpoll.driver,
        "python": platform.python_version(),
    }


def source_commit() -> str:
    """The commit the suite measures, marked `-dirty` when the work tree has uncommitted changes
    to tracked files (then the commit alone does not say what was built)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def measure_once(
    workload: Workload,
    config: Config,
    rep: int,
    ctx: RunContext,
    scratch: Path,
    haltpoll_param: Path = PARAM_PATH,
    haltpoll_journal: Path = JOURNAL_DIR,
) -> dict:
    """One run of `workload` under `config`; failures become records, not exceptions."""
    timeline_path = scratch / f"timeline-{workload.name}-{config.name}-{rep}.jsonl" if config.records_timeline else None
    record: dict = {"config": config.name, "rep": rep, "ok": False, "value": None, "wall_s": None,
                    "idle_per_s": None, "timeline": None, "error": None}

    def wrap(argv: list[str]) -> list[str]:
        return config.wrap(argv, ctx.gleaner, timeline_path)

    try:
        if config.sets_haltpoll:
            with ParamOverride(haltpoll_param, str(HALT_POLL_NS), ctx.stack, haltpoll_journal):
                measurement = workload.measure(ctx, wrap)
        else:
            measurement = workload.measure(ctx, wrap)
        record.update(ok=True, value=measurement.value, wall_s=measurement.wall_s,
                      idle_per_s={str(cpu): rate for cpu, rate in (measurement.idle_per_s or {}).items()} or None)
    except (WorkloadError, HaltpollError) as error:
        record["error"] = str(error)
    if timeline_path is not None:
        try:
            record["timeline"] = parse.compact_timeline(parse.read_timeline(timeline_path))
        except parse.ParseError as error:
            # A missing timeline makes the run incomplete even if the metric parsed.
            record.update(ok=False, error=(record["error"] or "") + f" timeline: {error}")
    return record


def phase_run(options: Options, ctx: RunContext, scratch: Path) -> dict:
    """The phase-changing pipeline under gleaner, for the active-vCPU timeline plot."""
    phases = ",".join(f"{label}:{seconds:g}s" for label, seconds in options.suite.phase_run)
    timeline_path = scratch / "timeline-phases.jsonl"
    argv = [str(ctx.gleaner), "run", "--timeline", str(timeline_path), "--",
            str(ctx.gleaner), "workload", "pipeline", "--phases", phases, "--json"]
    total_s = sum(seconds for _, seconds in options.suite.phase_run)
    block = {"argv": argv, "phases": [list(phase) for phase in options.suite.phase_run],
             "timeline": None, "report": None, "error": None}
    try:
        result = proc.run(argv, ctx.stack, total_s * 3 + 60)
        if result.returncode != 0:
            block["error"] = f"exit status {result.returncode}: {proc.tail(result.output)}"
        else:
            block["report"] = parse.last_json_object(result.output, "throughput_per_s")
        block["timeline"] = parse.read_timeline(timeline_path)
    except (proc.CommandError, parse.ParseError) as error:
        block["error"] = str(error)
    return block


def probe(ctx: RunContext, extra_args: tuple[str, ...]) -> dict:
    """`gleaner probe --json`, parsed; errors are recorded, not raised."""
    argv = [str(ctx.gleaner), "probe", "--json", *extra_args]
    try:
        result = proc.run(argv, ctx.stack, 300)
        if result.returncode != 0:
            return {"argv": argv, "error": f"exit status {result.returncode}: {proc.tail(result.output)}"}
        return {"argv": argv, "result": json.loads(result.stdout)}
    except (proc.CommandError, json.JSONDecodeError) as error:
        return {"argv": argv, "error": f"gleaner probe --json: {error}"}


def write_outputs(results: dict, stem: Path, with_plots: bool) -> list[Path]:
    """Writes JSON + Markdown (and plots when asked); returns the files written."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    if with_plots:
        from . import plots  # matplotlib is only needed once there is something to plot

        made = [
            plots.speedup_bars(results, Path(f"{stem}-speedup.png")),
            plots.idle_vs_speedup(results, Path(f"{stem}-idle-vs-speedup.png")),
        ]
        if results.get("probe", {}).get("result") is not None:
            made.append(plots.latency_cdf(results["probe"]["result"], Path(f"{stem}-wake-latency-cdf.png")))
        phase = results.get("phase_run") or {}
        if phase.get("timeline"):
            made.append(plots.active_timeline(phase["timeline"], [tuple(p) for p in phase["phases"]],
                                              Path(f"{stem}-active-vcpus.png")))
        results["plots"] = [path.name for path in made if path is not None]
        written += [path for path in made if path is not None]
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    md_path.write_text(report.markdown(results))
    return [json_path, md_path] + written


def run_suite(options: Options, stack: CleanupStack) -> list[Path]:
    """Runs the whole suite; returns the output files."""
    suite = options.suite
    for line in restore_stale(options.haltpoll_journal):
        log(f"restored {line}, left by a harness run that was killed")
    started = datetime.datetime.now()
    started_monotonic = time.monotonic()
    stem = output_stem(options.results_dir, suite.name, started)
    configs, config_records = config_statuses(options)
    loadavg = read_loadavg()
    warning = load_check(loadavg)
    if warning:
        log("!" * 72)
        log(f"WARNING: {warning}")
        log("!" * 72)
    idle_token = None
    try:
        idle_reader = IdleEntryReader(options.gleaner)
        idle_token = stack.push("stop gleaner __idle-entries", idle_reader.close)
        idle_source, read_idle = idle_reader.source, idle_reader.read
    except IdleSourceError as error:
        idle_source, read_idle = f"unavailable ({error})", None
        log(f"idle transitions will not be recorded: {error}")
    results: dict = {
        "suite": suite.name,
        "description": suite.description,
        "started": started.isoformat(timespec="seconds"),
        "reps": options.reps,
        "host": host_info(options.haltpoll),
        "load": {"before": list(loadavg), "threshold": LOAD_THRESHOLD, "warning": warning},
        "idle_source": idle_source,
        "gleaner": str(options.gleaner),
        "configs": config_records,
        # Each round's order is a row of a balanced Latin square (configs.balanced_orders);
        # files without this key ran every round in the configurations' canonical order.
        "run_order": "balanced",
        "workloads": [],
        "notes": [],
    }
    if options.reps < 5:
        results["notes"].append(f"only {options.reps} repetition(s): plumbing check, not a measurement")
    uses_gleaner = any(config.uses_gleaner for config in configs)
    scratch = Path(tempfile.mkdtemp(prefix="gleaner-bench-"))
    ctx = RunContext(options.gleaner, stack, scratch, read_idle)
    config_names = [config.name for config in configs]
    total_runs = len(suite.workloads) * len(configs) * options.reps
    estimate_min = suite.estimate_s(len(configs), options.reps) / 60
    log(f"suite {suite.name}: {len(suite.workloads)} workloads x {len(configs)} configurations x "
        f"{options.reps} reps = {total_runs} runs, estimated {estimate_min:.1f} min")
    done = 0

    def measure_workload(workload: Workload, record: dict) -> None:
        """Prepares `workload` and runs it under every configuration, interleaved."""
        nonlocal done
        log(f"{workload.name}: preparing")
        try:
            workload.prepare(ctx)
        except (WorkloadError, MariaDBError, OSError) as error:
            record["error"] = f"setup failed: {error}"
            log(f"{workload.name}: {record['error']}")
            return
        for rep, config in interleave(configs, options.reps):
            done += 1
            run = measure_once(workload, config, rep, ctx, scratch, options.haltpoll_param, options.haltpoll_journal)
            record["runs"].append(run)
            outcome = (f"{run['value']:.4g} {workload.unit} in {run['wall_s']:.1f} s" if run["ok"]
                       else f"FAILED: {run['error']}")
            log(f"[{done}/{total_runs}] {workload.name} {config.name} rep {rep + 1}/{options.reps}: {outcome}")
            # Rewritten after every run so an interrupted suite keeps what it measured.
            record["summary"] = report.summarise_workload(record, config_names)
            write_outputs(results, stem, with_plots=False)

    with stack.scoped(f"remove {scratch}", lambda: shutil.rmtree(scratch, ignore_errors=True)):
        if uses_gleaner:
            log("gleaner probe --json (wake-latency table)")
            results["probe"] = probe(ctx, suite.probe_args)
            if results["probe"].get("error"):
                log(f"probe failed: {results['probe']['error']}")
        for workload in suite.workloads:
            record = workload.describe() | {"runs": [], "error": None}
            record["summary"] = report.summarise_workload(record, config_names)
            results["workloads"].append(record)
            try:
                measure_workload(workload, record)
            finally:
                try:
                    workload.teardown(ctx)
                except (WorkloadError, MariaDBError, OSError) as error:
                    results["notes"].append(f"{workload.name} teardown: {error}")
                record["summary"] = report.summarise_workload(record, config_names)
        if uses_gleaner and suite.phase_run and any(config.name == "gleaner" for config in configs):
            log("phase-change run for the active-vCPU timeline")
            results["phase_run"] = phase_run(options, ctx, scratch)
    if idle_token is not None:
        stack.run_one(idle_token)
    results["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    results["elapsed_s"] = round(time.monotonic() - started_monotonic, 1)
    return write_outputs(results, stem, with_plots=True)
