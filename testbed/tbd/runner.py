"""Running an experiment: boot each case's guests, start their workloads together, record.

Why it exists: the paper's Shared setting needs every guest's workload to run at the same
time; this module starts them together, collects each guest's report and the host's view of
its vCPU threads, and writes one JSON line per run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .errors import TestbedError
from .experiment import Case, Experiment, guest_command, run_order
from .guest import Guest, GuestSet, parse_result
from .hostproc import stats_delta, vcpu_thread_ids

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


def pin_vcpus(guests: list[Guest], host_cpus: list[int], proc_root: Path = Path("/proc"),
              set_affinity=os.sched_setaffinity) -> dict[str, dict[int, int]]:
    """Pins vCPU i of every guest to host_cpus[i % len(host_cpus)]; returns guest -> {vCPU: CPU}.

    Every guest's vCPU 0 then shares one CPU, vCPU 1 the next, as in the paper's Shared
    setting, and no run depends on where the host scheduler happened to put the threads.
    """
    if not host_cpus:
        raise TestbedError("no host CPU to pin vCPUs to (the driver's affinity is empty)")
    pinned = {}
    for guest in guests:
        ids = vcpu_thread_ids(proc_root, guest.proc.pid)
        if sorted(ids) != list(range(guest.spec.vcpus)):
            raise TestbedError(
                f"guest {guest.spec.name}: found vCPU threads {sorted(ids)} in {proc_root}/{guest.proc.pid}/task, "
                f"expected 0..{guest.spec.vcpus - 1}; QEMU must run with -name ...,debug-threads=on, "
                "or set pin_vcpus = false"
            )
        pinned[guest.spec.name] = {}
        for vcpu, tid in sorted(ids.items()):
            cpu = host_cpus[vcpu % len(host_cpus)]
            try:
                set_affinity(tid, {cpu})
            except OSError as err:
                raise TestbedError(f"cannot pin guest {guest.spec.name}'s vCPU {vcpu} (thread {tid}) to CPU {cpu}: "
                                   f"{err.strerror}; set pin_vcpus = false") from err
            pinned[guest.spec.name][vcpu] = cpu
    return pinned


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
                pinning = None
                if exp.pin_vcpus:
                    pinning = pin_vcpus(guests, sorted(os.sched_getaffinity(0)))
                    print(f"testbed: case {case.name}: vCPUs pinned {pinning}", file=sys.stderr)
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
                    record = {"case": case.name, "rep": rep, "setting": setting, "run_id": run_id,
                              "vcpu_pinning": pinning, **result}
                    runs.write(json.dumps(record) + "\n")
                    bench = next(g for g in case.guests if g.role == "benchmark").name
                    tput = result["guests"][bench]["report"].get("throughput_per_s", float("nan"))
                    print(f"testbed: {case.name} rep {rep + 1}/{exp.repetitions} gleaner {setting}: "
                          f"{bench} {tput:.1f}/s", file=sys.stderr)  # fmt: skip
    return runs_path
